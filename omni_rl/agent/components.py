"""Tools and environments: the two registered components an agent's trajectory talks to.

A `Tool` declares its name, a description and its argument schema (JSON Schema, shown to the
model through the chat template) and answers a call with an `Observation` (text, and for an omni
model an image). An `Environment` is built per trajectory, holds its state across the turns, and
after each model turn says what the model reads next, a per-turn reward, and whether it is done.
Both own their options (`Options`, a dataclass bound at load from `agent.tools[i].tool_options` /
`agent.environment_options`). Not here: running them safely (`runner.py`), the loop (`loop.py`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from omni_rl.config.options import NoOptions
from omni_rl.registry import Registry


@dataclass
class Observation:
    """What a tool answers: the text the model reads, and what a text model cannot read but a
    reward or an omni model may (an image, a score)."""

    text: str
    image: Any = None
    score: Optional[float] = None


@dataclass
class ToolCall:
    """One call the model wrote: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ToolCallRecord:
    """A call as the trajectory keeps it: what was asked, what came back, and how."""

    name: str
    arguments: Any
    observation: str
    ok: bool
    # Why it failed: malformed, unknown_tool, bad_arguments, timeout, crashed (None when ok).
    error: Optional[str] = None
    truncated: bool = False
    seconds: float = 0.0
    score: Optional[float] = None
    # The tool's image (Observation.image), kept for a model that reads images; not in to_dict.
    image: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "observation": self.observation, "ok": self.ok,
                "error": self.error, "truncated": self.truncated, "seconds": round(self.seconds, 4),
                **({"score": self.score} if self.score is not None else {})}


class Tool(ABC):
    """A function the model may call. Subclasses set `description` and `parameters` (the JSON
    Schema of the arguments object) and implement `__call__`; `register_tool` names them."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}
    # Where its calls run (`runner.py`): "thread" (this process; a tool holding a model) or
    # "process" (a forked child per call, killed at the timeout; pure-Python work, no torch).
    isolation: ClassVar[str] = "thread"
    Options: ClassVar[type] = NoOptions

    def __init__(self, options: Any = None):
        self.options = options

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The tool as the chat template's `tools=` takes it (OpenAI's function format)."""
        return {"type": "function",
                "function": {"name": cls.name, "description": cls.description, "parameters": cls.parameters}}

    @classmethod
    def image_size(cls, options: Any) -> Optional[tuple[int, int]]:
        """(height, width) in pixels of the images its observations carry, for `--plan` to count
        what they cost a model that reads them; None: it answers text only."""
        return None

    @abstractmethod
    def __call__(self, arguments: dict[str, Any]) -> Observation | str:
        """Answer one call; may raise (the runner turns that into an error observation)."""


@dataclass
class Turn:
    """One model turn as an environment sees it: its text and its tool calls with their answers."""

    index: int
    text: str
    tool_calls: list[ToolCallRecord] = field(default_factory=list)


@dataclass
class EnvStep:
    """An environment's answer to a model turn: text the model reads next as a user turn (None:
    nothing to say), a reward for the turn, and whether the trajectory is over."""

    observation: Optional[str] = None
    reward: float = 0.0
    done: bool = False


class Environment(ABC):
    """State across the turns of one trajectory; built once per trajectory from the prompt."""

    Options: ClassVar[type] = NoOptions

    def __init__(self, options: Any, prompt: str, metadata: dict[str, Any]):
        self.options = options
        self.prompt = prompt
        self.metadata = metadata

    @abstractmethod
    def step(self, turn: Turn) -> EnvStep:
        """After each model turn (its tool calls already answered)."""


ISOLATIONS = ("thread", "process")
TOOLS: Registry[type[Tool]] = Registry("tool")
ENVIRONMENTS: Registry[type[Environment]] = Registry("environment")


def register_tool(name: str):
    """Class decorator: register a `Tool` subclass under `name` (the name the model calls),
    after checking its declarations: a valid JSON Schema of an object, a known isolation."""
    def decorator(cls: type[Tool]) -> type[Tool]:
        check_tool_declarations(name, cls)
        cls.name = name
        return TOOLS.register(name)(cls)

    return decorator


def check_tool_declarations(name: str, cls: type[Tool]) -> None:
    """ValueError naming the tool and what it declared wrong."""
    if cls.isolation not in ISOLATIONS:
        raise ValueError(f"tool {name!r}: isolation={cls.isolation!r}; expected one of {', '.join(ISOLATIONS)}")
    try:
        Draft202012Validator.check_schema(cls.parameters)
    except SchemaError as err:
        raise ValueError(f"tool {name!r}: its parameters are not a JSON Schema: {err.message}") from None
    if cls.parameters.get("type") != "object":
        raise ValueError(f"tool {name!r}: parameters type={cls.parameters.get('type')!r}; expected 'object' (a tool's "
                         f"arguments are a JSON object)")


def register_environment(name: str):
    """Class decorator: register an `Environment` subclass under `name` (`agent.environment`)."""
    return ENVIRONMENTS.register(name)

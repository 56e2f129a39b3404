"""`AgentOptions`: the agent loop's options, `algo.family_options.agent_options` of a text model.

Set, the block makes the run agentic (the text family's `agent` variant); left empty, the text
family samples one response per prompt as before. The tools' and the environment's own options
(`tools[i].tool_options`, `environment_options`) are bound to their classes' `Options` by the
composition root. A trajectory ends when the model answers without a tool call (and the
environment, if any, is done), or at a limit here; a limit keeps what the trajectory has and
records the reason (`agent/finish/<reason>` and the sample log).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from omni_rl.option import ComponentOptions, option

TURN_REWARD_MODES = ("sum", "discounted")


@dataclass
class AgentOptions(ComponentOptions):
    tools: list[dict[str, Any]] = option([], "The tools the model may call, each {name: NAME, tool_options: {...}} "
                                             "(registered names: `omni_rl.agent.TOOLS`).")
    environment: Optional[str] = option(None, "A registered environment: state across one trajectory's turns, a "
                                              "reward per turn (null: none).")
    environment_options: dict[str, Any] = option({}, "The environment's options.")
    system_prompt: Optional[str] = option(None, "A system turn before each prompt (the template puts the tools there "
                                                "too).")
    max_turns: int = option(4, "Model turns per trajectory; after the last the trajectory ends (max_turns).")
    max_total_tokens: int = option(512, "Tokens after the prompt, model and fed turns together; the trajectory ends "
                                        "when its next turn would not fit (max_total_tokens).")
    tool_timeout_s: float = option(10.0, "A tool call not answered within this is cut off (an error observation).")
    max_tool_output_chars: int = option(2000, "A tool's answer is cut to this many characters.")
    tool_threads: int = option(8, "Threads that step the trajectories' sessions (each tool call has its own too).")
    turn_reward: str = option("sum", "How an environment's per-turn rewards make the return: sum or discounted.")
    discount: float = option(1.0, "The discount of turn_reward=discounted, in [0, 1].")

    @property
    def enabled(self) -> bool:
        return bool(self.tools) or self.environment is not None

    def check(self) -> None:
        for i, item in enumerate(self.tools):
            if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or \
                    set(item) - {"name", "tool_options"}:
                raise ValueError(f"tools[{i}]={item!r}: expected {{name: TOOL, tool_options: {{...}}}}")
        names = [item["name"] for item in self.tools]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"tools: {', '.join(repeated)} listed twice; list each tool once (the model calls it by name)")
        for key in ("max_turns", "max_total_tokens", "max_tool_output_chars", "tool_threads"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)!r}: expected an integer >= 1")
        if not (math.isfinite(self.tool_timeout_s) and self.tool_timeout_s > 0):
            raise ValueError(f"tool_timeout_s={self.tool_timeout_s!r}: expected a finite number of seconds > 0")
        if self.turn_reward not in TURN_REWARD_MODES:
            raise ValueError(f"turn_reward={self.turn_reward!r}: expected one of {', '.join(TURN_REWARD_MODES)}")
        if not 0 <= self.discount <= 1:
            raise ValueError(f"discount={self.discount!r}: expected in [0, 1]")


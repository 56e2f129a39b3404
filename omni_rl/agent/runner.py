"""Running a tool call so that nothing it does can stop the rollout.

Each call runs in a daemon thread of its own and is waited for at most `timeout_s`: a tool that
hangs is cut off (its thread is left to finish or die with the process; Python cannot kill a
thread, so a tool that must be killed should run its work in a subprocess itself), a tool that
raises becomes an error observation naming the exception, and an answer longer than
`max_output_chars` is cut to that many characters with a note the model reads. Malformed calls,
unknown tools and arguments that do not fit the schema never reach a tool.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Mapping

from omni_rl.agent.components import Observation, Tool, ToolCall, ToolCallRecord

# The longest exception message an error observation quotes.
_ERROR_CHARS = 300
_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def check_arguments(arguments: Any, schema: Mapping[str, Any]) -> str | None:
    """Why `arguments` do not fit the tool's JSON Schema (an object's required keys and the
    top-level property types), or None when they fit."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    properties = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(missing)}"
    if schema.get("additionalProperties") is False:
        extra = sorted(set(arguments) - set(properties))
        if extra:
            return f"unknown argument(s) {', '.join(extra)}; expected {', '.join(properties) or 'none'}"
    for key, value in arguments.items():
        expected = _JSON_TYPES.get(properties.get(key, {}).get("type"))
        if expected is not None and (not isinstance(value, expected) or (expected is not bool and isinstance(value, bool))):
            return f"argument {key}={value!r}: expected a JSON {properties[key]['type']}"
    return None


class ToolRunner:
    def __init__(self, tools: Mapping[str, Tool], timeout_s: float, max_output_chars: int):
        self.tools = dict(tools)
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars

    def run(self, call: ToolCall) -> ToolCallRecord:
        """Answer one well-formed call; every failure is a record with an error observation."""
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolCallRecord(call.name, call.arguments, f"error: unknown tool {call.name!r}; the tools are: {known}",
                                  ok=False, error="unknown_tool")
        problem = check_arguments(call.arguments, tool.parameters)
        if problem is not None:
            return ToolCallRecord(call.name, call.arguments, f"error: {call.name}: {problem}", ok=False,
                                  error="bad_arguments")
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = tool(dict(call.arguments))
            except BaseException as err:  # noqa: BLE001 - any failure of a tool is the model's observation
                box["error"] = err

        start = time.perf_counter()
        thread = threading.Thread(target=target, name=f"tool-{call.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        seconds = time.perf_counter() - start
        if thread.is_alive():
            return ToolCallRecord(call.name, call.arguments,
                                  f"error: {call.name} gave no answer within {self.timeout_s:g} s and was cut off",
                                  ok=False, error="timeout", seconds=seconds)
        if "error" in box:
            err = box["error"]
            message = str(err)[:_ERROR_CHARS]
            return ToolCallRecord(call.name, call.arguments, f"error: {call.name} failed: {type(err).__name__}: {message}",
                                  ok=False, error="crashed", seconds=seconds)
        value = box.get("value")
        observation = value if isinstance(value, Observation) else Observation(text="" if value is None else str(value))
        text, truncated = self.cap(observation.text)
        return ToolCallRecord(call.name, call.arguments, text, ok=True, truncated=truncated, seconds=seconds,
                              score=observation.score, image=observation.image)

    def cap(self, text: str) -> tuple[str, bool]:
        """`text` cut to `max_output_chars`, with a note saying how long it was."""
        if len(text) <= self.max_output_chars:
            return text, False
        return (f"{text[:self.max_output_chars]}\n[cut: the answer was {len(text)} characters, over the "
                f"{self.max_output_chars}-character limit]"), True

"""Running a tool call so that nothing it does can stop the rollout.

A tool declares where its calls run (`Tool.isolation`). `"thread"` (the default; a tool that
holds a model must use it): a daemon thread of this process, waited for at most `timeout_s`; a
call that hangs is cut off and its thread is left to finish or die with the process (Python
cannot kill a thread). `"process"`: a forked child process per call, killed at the timeout, so a
call that computes forever takes no core and no GIL from the rollout; its arguments and answer
must pickle, and it should not use torch (a forked child of a multithreaded process must not
touch the parent's thread pools). Either way a tool that raises (or whose child dies) becomes an
error observation naming the failure, and an answer longer than `max_output_chars` is cut to that
many characters with a note the model reads (a child cuts it before sending it back). Malformed
calls, unknown tools and arguments that do not fit the tool's JSON Schema (checked by the
`jsonschema` package, draft 2020-12) never reach a tool.
"""
from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import replace
from typing import Any, Mapping

from jsonschema import Draft202012Validator

from omni_rl.agent.components import Observation, Tool, ToolCall, ToolCallRecord

# The longest exception message an error observation quotes.
_ERROR_CHARS = 300
# How the schema's errors are reported first: a missing key, then an unknown one, then the rest.
_ERROR_ORDER = {"required": 0, "additionalProperties": 1}


def check_arguments(arguments: Any, schema: Mapping[str, Any]) -> str | None:
    """Why `arguments` do not fit the tool's JSON Schema, or None when they fit."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    errors = sorted(Draft202012Validator(schema).iter_errors(arguments),
                    key=lambda e: (_ERROR_ORDER.get(e.validator, 2), len(e.absolute_path), list(map(str, e.absolute_path))))
    if not errors:
        return None
    error = errors[0]
    path = list(error.absolute_path)
    if not path and error.validator == "required":
        missing = [k for k in schema.get("required", []) if k not in arguments]
        return f"missing required argument(s) {', '.join(missing)}"
    if not path and error.validator == "additionalProperties":
        extra = sorted(set(arguments) - set(schema.get("properties", {})))
        return f"unknown argument(s) {', '.join(extra)}; expected {', '.join(schema.get('properties', {})) or 'none'}"
    if len(path) == 1 and error.validator == "type":
        return f"argument {path[0]}={error.instance!r}: expected a JSON {error.validator_value}"
    where = "/".join(map(str, path)) or "(the object)"
    return f"argument {where}: {error.message[:_ERROR_CHARS]}"


def _as_observation(value: Any) -> Observation:
    return value if isinstance(value, Observation) else Observation(text="" if value is None else str(value))


def _call_in_child(conn, tool: Tool, arguments: dict, max_chars: int) -> None:
    """A forked child's whole life: one call, its answer cut to the cap, sent back once."""
    try:
        observation = _as_observation(tool(arguments))
        length = len(observation.text)
        conn.send(("value", replace(observation, text=observation.text[:max_chars]), length))
    except BaseException as err:  # noqa: BLE001 - any failure of a tool is the model's observation
        conn.send(("error", type(err).__name__, str(err)[:_ERROR_CHARS]))
    finally:
        conn.close()


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
        start = time.perf_counter()
        run = self._in_process if tool.isolation == "process" else self._in_thread
        outcome = run(tool, call)
        seconds = time.perf_counter() - start
        if outcome[0] == "timeout":
            stopped = "was stopped" if tool.isolation == "process" else "was cut off"
            return ToolCallRecord(call.name, call.arguments,
                                  f"error: {call.name} gave no answer within {self.timeout_s:g} s and {stopped}",
                                  ok=False, error="timeout", seconds=seconds)
        if outcome[0] == "error":
            _, kind, message = outcome
            return ToolCallRecord(call.name, call.arguments, f"error: {call.name} failed: {kind}: {message}",
                                  ok=False, error="crashed", seconds=seconds)
        _, observation, length = outcome
        text, truncated = self.cap(observation.text, length)
        return ToolCallRecord(call.name, call.arguments, text, ok=True, truncated=truncated, seconds=seconds,
                              score=observation.score, image=observation.image)

    def _in_thread(self, tool: Tool, call: ToolCall) -> tuple:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = tool(dict(call.arguments))
            except BaseException as err:  # noqa: BLE001 - any failure of a tool is the model's observation
                box["error"] = err

        thread = threading.Thread(target=target, name=f"tool-{call.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            return ("timeout",)
        if "error" in box:
            return ("error", type(box["error"]).__name__, str(box["error"])[:_ERROR_CHARS])
        observation = _as_observation(box.get("value"))
        return ("value", observation, len(observation.text))

    def _in_process(self, tool: Tool, call: ToolCall) -> tuple:
        # fork: the child starts at once with the tool as it is (no pickling, no re-import of torch).
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_call_in_child, args=(send, tool, dict(call.arguments), self.max_output_chars),
                                name=f"tool-{call.name}", daemon=True)
        child.start()
        send.close()
        try:
            if not receive.poll(self.timeout_s):
                return ("timeout",)
            try:
                return receive.recv()
            except EOFError:  # the child died without answering (os._exit, a signal, a segfault)
                child.join(5)
                return ("error", "ChildProcessError", f"its process ended with exit code {child.exitcode}")
        finally:
            receive.close()
            if child.is_alive():
                child.kill()
            child.join()

    def cap(self, text: str, length: int | None = None) -> tuple[str, bool]:
        """`text` cut to `max_output_chars`, with a note saying how long it was (`length`: the
        whole answer's length where `text` is already cut)."""
        length = len(text) if length is None else length
        if length <= self.max_output_chars:
            return text, False
        return (f"{text[:self.max_output_chars]}\n[cut: the answer was {length} characters, over the "
                f"{self.max_output_chars}-character limit]"), True

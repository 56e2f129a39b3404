"""Bad input never ends the run (issue 41): a hanging, a crashing and a flooding tool, malformed
tool-call JSON, an unknown tool and the turn limit each become what the trajectory records, and
the loop goes on. The sessions are driven by a scripted engine (the turns' texts are given), so
these tests need no model."""
from __future__ import annotations

import os
import re
import time
from concurrent.futures import Future

import pytest

from omni_rl.agent import Observation, Tool, register_tool
from omni_rl.agent.components import TOOLS as TOOL_REGISTRY
from omni_rl.agent.chat import parse_tool_calls
from omni_rl.agent.loop import run_trajectories
from omni_rl.agent.runner import ToolRunner, check_arguments
from omni_rl.agent.components import ToolCall
from omni_rl.agent.trajectory import combine_turn_rewards
from omni_rl.agent.options import AgentOptions


class Echo(Tool):
    name = "echo"
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def __call__(self, arguments):
        return arguments["text"]


class Hang(Tool):
    name = "hang"

    def __call__(self, arguments):
        time.sleep(30)
        return "late"


class Crash(Tool):
    name = "crash"

    def __call__(self, arguments):
        raise RuntimeError("disk on fire")


class Flood(Tool):
    name = "flood"

    def __call__(self, arguments):
        return Observation(text="x" * 100_000_000, score=0.5)  # 100 MB


TOOLS = {t.name: t() for t in (Echo, Hang, Crash, Flood)}


class Spin(Tool):
    """Computes forever in pure Python: in a thread it would keep a core and the GIL."""
    name = "spin"
    isolation = "process"

    def __call__(self, arguments):
        with open(arguments["pid_file"], "w") as f:
            f.write(str(os.getpid()))
        while True:
            pass


class Die(Tool):
    name = "die"
    isolation = "process"

    def __call__(self, arguments):
        os._exit(3)


class FloodInChild(Flood):
    name = "flood_in_child"
    isolation = "process"


class Ranged(Tool):
    name = "ranged"
    parameters = {"type": "object", "additionalProperties": False, "required": ["n"],
                  "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9},
                                 "unit": {"enum": ["cm", "in"]},
                                 "point": {"type": "object", "required": ["x"], "properties": {"x": {"type": "number"}}}}}

    def __call__(self, arguments):
        return str(arguments["n"])


def test_a_hanging_tool_is_cut_off_at_its_timeout():
    start = time.perf_counter()
    record = ToolRunner(TOOLS, timeout_s=0.2, max_output_chars=100).run(ToolCall("hang", {}))
    assert time.perf_counter() - start < 10  # not the tool's 30 s
    assert not record.ok and record.error == "timeout"
    assert record.observation == "error: hang gave no answer within 0.2 s and was cut off"


def test_a_crashing_tool_is_an_error_observation():
    record = ToolRunner(TOOLS, timeout_s=5, max_output_chars=100).run(ToolCall("crash", {}))
    assert not record.ok and record.error == "crashed"
    assert record.observation == "error: crash failed: RuntimeError: disk on fire"


def test_a_100_mb_answer_is_cut_to_the_cap():
    record = ToolRunner(TOOLS, timeout_s=30, max_output_chars=50).run(ToolCall("flood", {}))
    assert record.ok and record.truncated and record.score == 0.5
    assert record.observation.startswith("x" * 50 + "\n[cut: the answer was 100000000 characters")
    assert len(record.observation) < 200


def test_unknown_tools_and_bad_arguments_never_reach_a_tool():
    runner = ToolRunner(TOOLS, timeout_s=5, max_output_chars=100)
    unknown = runner.run(ToolCall("search", {"q": "x"}))
    assert unknown.error == "unknown_tool"
    assert unknown.observation == "error: unknown tool 'search'; the tools are: crash, echo, flood, hang"
    missing = runner.run(ToolCall("echo", {}))
    assert missing.error == "bad_arguments" and "missing required argument(s) text" in missing.observation
    assert check_arguments({"text": 3}, Echo.parameters) == "argument text=3: expected a JSON string"
    assert check_arguments({"text": "hi"}, Echo.parameters) is None


def test_a_process_tool_that_computes_forever_is_killed_at_its_timeout(tmp_path):
    pid_file = tmp_path / "pid"
    record = ToolRunner({"spin": Spin()}, timeout_s=1.0, max_output_chars=100).run(
        ToolCall("spin", {"pid_file": str(pid_file)}))
    assert not record.ok and record.error == "timeout"
    assert record.observation == "error: spin gave no answer within 1 s and was stopped"
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped: no process has that id any more
        os.kill(pid, 0)


def test_a_process_tool_whose_child_dies_and_one_that_floods_are_observations():
    runner = ToolRunner({"die": Die(), "flood_in_child": FloodInChild()}, timeout_s=60, max_output_chars=50)
    died = runner.run(ToolCall("die", {}))
    assert not died.ok and died.error == "crashed"
    assert died.observation == "error: die failed: ChildProcessError: its process ended with exit code 3"
    flood = runner.run(ToolCall("flood_in_child", {}))
    assert flood.ok and flood.truncated and flood.score == 0.5
    assert flood.observation.startswith("x" * 50 + "\n[cut: the answer was 100000000 characters")


@pytest.mark.parametrize("arguments, problem", [
    ({"n": 3, "unit": "cm", "point": {"x": 1.5}}, None),
    ({"n": 0}, "argument n: 0 is less than the minimum of 1"),
    ({"n": 3, "unit": "mm"}, "argument unit: 'mm' is not one of ['cm', 'in']"),
    ({"n": 3, "point": {}}, "argument point: 'x' is a required property"),
    ({"n": 3, "point": {"x": "left"}}, "argument point/x: 'left' is not of type 'number'"),
    ({"n": 3, "colour": "red"}, "unknown argument(s) colour; expected n, unit, point"),
    ({"n": True}, "argument n=True: expected a JSON integer"),
    ({"unit": "cm"}, "missing required argument(s) n"),
])
def test_arguments_are_checked_against_the_whole_json_schema(arguments, problem):
    assert check_arguments(arguments, Ranged.parameters) == problem


@pytest.mark.parametrize("attrs, message", [
    ({"isolation": "container"}, "isolation='container'; expected one of thread, process"),
    ({"parameters": {"type": "object", "properties": {"n": {"type": "integr"}}}}, "not a JSON Schema"),
    ({"parameters": {"type": "array"}}, "parameters type='array'; expected 'object'"),
])
def test_a_tool_that_declares_a_bad_schema_or_isolation_does_not_register(attrs, message):
    bad = type("Bad", (Echo,), attrs)
    with pytest.raises(ValueError, match=re.escape(message)):
        register_tool("bad_tool_never_registered")(bad)
    assert "bad_tool_never_registered" not in TOOL_REGISTRY


@pytest.mark.parametrize("text, calls, errors", [
    ('<tool_call>\n{"name": "echo", "arguments": {"text": "a"}}\n</tool_call>', [("echo", {"text": "a"})], 0),
    ('<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"a\\"}"}</tool_call>', [("echo", {"text": "a"})], 0),
    ('<tool_call>{"name": "echo", "arguments": {"text": </tool_call>', [], 1),   # JSON cut short
    ('<tool_call>{"arguments": {}}</tool_call>', [], 1),                        # no name
    ('<tool_call>{"name": "echo", "arguments": [1]}</tool_call>', [], 1),       # arguments not an object
    ('<tool_call>{"name": "echo", "arguments": {}}', [], 1),                    # never closed
    ("just an answer", [], 0),
])
def test_tool_calls_are_parsed_and_malformed_ones_are_errors(text, calls, errors):
    parsed, problems = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in parsed] == calls
    assert len(problems) == errors and all(p.startswith("error: ") for p in problems)


def test_turn_rewards_sum_or_discount():
    assert combine_turn_rewards([1.0, 2.0, 4.0], "sum", 0.5) == 7.0
    assert combine_turn_rewards([1.0, 2.0, 4.0], "discounted", 0.5) == 1.0 + 1.0 + 1.0  # 1 + 0.5*2 + 0.25*4


# --- the loop, on a scripted engine ------------------------------------------------------------

class ScriptedChat:
    """Continuations as token ids of the text, so the test reads what the model was fed."""

    def __init__(self):
        self.fed = []

    def prompt_messages(self, messages):
        return list(messages)

    def continuation_ids(self, messages, turn_closed):
        self.fed.append(messages)
        return [ord(c) for c in "".join(m["content"] for m in messages)][:20]


class ScriptedEngine:
    """`generate_turns` whose model turns are given texts (ids are characters, 0 the stop token)."""

    def __init__(self, turns: dict[int, list[str]]):
        self.turns = turns

    def generate_turns(self, requests, handler, max_total_tokens):
        out = []
        for k, req in enumerate(requests):
            fed_tokens, n = 0, 0
            for text in self.turns[k]:
                ids = [ord(c) for c in text] + [0]
                fed_tokens += len(ids)
                future: Future = handler.end_turn(req.request_id, ids, "stop", max_total_tokens - fed_tokens)
                answer = future.result(timeout=60)
                n += 1
                if answer is None:
                    break
                fed_tokens += len(answer)
            out.append(n)
        return out


class Request:
    def __init__(self, i):
        self.request_id = 1000 + i


def _run(turns, **agent):
    cfg = AgentOptions(max_total_tokens=10_000, tool_timeout_s=0.3, max_tool_output_chars=64, **agent)
    chat = ScriptedChat()
    results, trajectories = run_trajectories(
        ScriptedEngine(turns), [Request(i) for i in turns], ["q"] * len(turns), [{}] * len(turns), cfg, TOOLS, chat,
        decode=lambda ids: "".join(chr(i) for i in ids))
    return results, trajectories, chat


def call(name, **arguments):
    import json
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_every_kind_of_bad_call_is_an_observation_and_the_trajectory_goes_on():
    turns = {0: [call("hang"), call("crash"), call("flood"), '<tool_call>{"name": </tool_call>', call("search"),
                 "done"]}
    _, [t], chat = _run(turns, max_turns=10)
    assert t.finish_reason == "answer" and t.model_turns == 6
    assert [c.error for c in t.tool_calls] == ["timeout", "crashed", None, "malformed", "unknown_tool"]
    assert t.tool_calls[2].truncated
    # What the model read after each turn: the error observations, as tool turns.
    assert [m[0]["role"] for m in chat.fed] == ["tool"] * 5
    assert chat.fed[0][0]["content"].startswith("error: hang gave no answer")
    assert t.answer == "done"


def test_the_turn_limit_ends_the_trajectory_with_what_it_has():
    turns = {0: [call("echo", text="a")] * 5, 1: ["an answer"]}
    results, trajectories, _ = _run(turns, max_turns=3)
    assert [t.finish_reason for t in trajectories] == ["max_turns", "answer"]
    assert trajectories[0].model_turns == 3 and len(trajectories[0].tool_calls) == 3
    assert results == [3, 1]  # the engine was told to stop after the third turn


def test_a_full_budget_ends_the_trajectory():
    turns = {0: [call("echo", text="a" * 30)] * 3}
    cfg_tokens = len(call("echo", text="a" * 30)) + 1 + 5  # room for the first turn, not its answer
    cfg = AgentOptions(max_total_tokens=cfg_tokens, max_turns=5)
    _, [t] = run_trajectories(ScriptedEngine(turns), [Request(0)], ["q"], [{}], cfg, TOOLS, ScriptedChat(),
                              decode=lambda ids: "".join(chr(i) for i in ids))
    assert t.finish_reason == "max_total_tokens" and t.model_turns == 1

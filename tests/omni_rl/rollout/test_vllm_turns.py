"""The `vllm` backend's multi-turn loop (`vllm_omni/text_turns.py`) on a stand-in for vLLM's
`LLMEngine` (no vLLM needed): turns of different trajectories share engine steps, each turn's
prompt is the whole trajectory so far, fed tokens are masked with log-prob 0, the finish reasons
are the native engine's, and a failing loop aborts what vLLM still runs. vLLM itself:
`test_vllm_cpu.py`."""
from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
import torch

from omni_rl.models.autoregressive import PromptInputs
from omni_rl.rollout.text_types import TextRequest
from omni_rl.rollout.vllm_omni.text_turns import decode_turns_vllm, turn_reason, turn_seed

STOP = 0


class FakeEngine:
    """Emits one token per step per running request: `plan[prompt length]`'s tokens, in order, up to
    max_tokens; the token 0 is a stop token. Log-prob of token t: -t / 100. The prefix cache serves
    every prompt token but the last block's (blocks of 4)."""

    def __init__(self, plans: dict[int, list[int]]):
        self.plans = plans
        self.running: dict[str, dict] = {}
        self.added: list[tuple[str, list[int], int]] = []
        self.steps: list[set[str]] = []
        self.aborted: list[str] = []

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def add_request(self, rid, prompt, params, lora_request=None):
        ids = prompt["prompt_token_ids"]
        self.added.append((rid, ids, params.max_tokens))
        self.running[rid] = {"ids": ids, "out": [], "params": params, "plan": list(self.plans[len(ids)])}

    def step(self):
        self.steps.append(set(self.running))
        outputs = []
        for rid, r in list(self.running.items()):
            token = r["plan"].pop(0)
            r["out"].append(token)
            stopped = token == STOP
            if stopped or len(r["out"]) >= r["params"].max_tokens:
                del self.running[rid]
                done = SimpleNamespace(token_ids=r["out"], logprobs=[{t: -t / 100} for t in r["out"]],
                                       finish_reason="stop" if stopped else "length")
                outputs.append(SimpleNamespace(request_id=rid, finished=True, outputs=[done], prompt_token_ids=r["ids"],
                                               num_cached_tokens=len(r["ids"]) // 4 * 4))
        return outputs

    def abort_request(self, ids, internal=False):
        self.aborted += ids
        for rid in ids:
            self.running.pop(rid, None)


class Feeder:
    """Answers each trajectory's turns from a script: ids to feed, or None (it ends)."""

    def __init__(self, script: dict[int, list]):
        self.script = {k: list(v) for k, v in script.items()}
        self.turns: list[tuple[int, list[int], str, int]] = []

    def end_turn(self, request_id, turn_ids, finish_reason, room) -> Future:
        self.turns.append((request_id, list(turn_ids), finish_reason, room))
        future: Future = Future()
        answer = self.script[request_id].pop(0)
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)
        return future


def params_for(req, turn, max_tokens):
    return SimpleNamespace(max_tokens=max_tokens, seed=turn_seed(req.seed, turn))


def run(engine, requests, handler, max_total_tokens):
    stats = {"turn_steps": 0, "mixed_turn_steps": 0, "continued_prompt_tokens": 0, "prefix_cached_tokens": 0,
             "samples": 0}
    results = decode_turns_vllm(engine, requests, handler, max_total_tokens, params_for,
                                lambda req, ids, lps: [float(lp[t]) for t, lp in zip(ids, lps)],
                                lambda ids: " ".join(map(str, ids)), 3, stats)
    return results, stats


def request(rid: int, prompt_len: int, max_new_tokens: int = 4) -> TextRequest:
    return TextRequest(PromptInputs(torch.arange(1, prompt_len + 1)), seed=rid, max_new_tokens=max_new_tokens,
                       request_id=rid)


def test_trajectories_at_different_turns_share_steps_and_fed_tokens_are_masked():
    # Trajectory 1: a 2-token call ending in the stop token, 3 fed tokens, a 1-token answer.
    # Trajectory 2: a 4-token turn cut at max_new_tokens, 1 fed token, then a stop.
    engine = FakeEngine({5: [7, STOP], 5 + 2 + 3: [STOP], 6: [8, 9, 8, 9], 6 + 4 + 1: [9, STOP]})
    feeder = Feeder({1: [[31, 32, 33], None], 2: [[41], None]})
    first, second = request(1, 5), request(2, 6)
    (a, b), stats = run(engine, [first, second], feeder, max_total_tokens=20)

    assert a.response_ids.tolist() == [7, STOP, 31, 32, 33, STOP]
    assert a.response_mask.tolist() == [1, 1, 0, 0, 0, 1]
    assert torch.equal(a.log_probs, torch.tensor([-0.07, 0.0, 0.0, 0.0, 0.0, 0.0]))
    assert b.response_ids.tolist() == [8, 9, 8, 9, 41, 9, STOP]
    assert b.response_mask.tolist() == [1, 1, 1, 1, 0, 1, 1]
    assert [(t[0], t[2]) for t in feeder.turns] == [(1, "stop"), (1, "stop"), (2, "length"), (2, "stop")]
    assert a.finish_reason == "stop" and b.weight_version == 3 and a.text == "7 0 31 32 33 0"
    # Each turn's prompt is the whole trajectory so far.
    prompts = {rid: ids for rid, ids, _ in engine.added}
    continued = [ids for rid, ids, _ in engine.added if rid.endswith("-1-1")]
    assert continued == [list(range(1, 6)) + [7, STOP, 31, 32, 33]]
    assert len(prompts) == 4
    # Trajectory 1's second turn ran in the same step as trajectory 2's first.
    assert stats["mixed_turn_steps"] >= 1 and stats["turn_steps"] == len(engine.steps)
    # The cache counters are the continued turns' (10 and 11 prompt tokens, 8 of each cached).
    assert (stats["continued_prompt_tokens"], stats["prefix_cached_tokens"]) == (21, 16)
    assert a.extras == {"turns": 2, "continued_prompt_tokens": 10, "prefix_cached_tokens": 8}
    assert turn_seed(1, 0) == 1 and turn_seed(1, 1) != turn_seed(1, 2)


def test_the_trajectory_budget_caps_a_turn_and_is_named_as_its_reason():
    engine = FakeEngine({3: [5, 5, 5, 5, 5, 5]})
    feeder = Feeder({7: [None]})
    (result,), _ = run(engine, [request(7, 3, max_new_tokens=6)], feeder, max_total_tokens=4)
    assert engine.added[0][2] == 4  # the turn's max_tokens is the trajectory's room
    assert feeder.turns == [(7, [5, 5, 5, 5], "max_total_tokens", 0)]
    assert result.finish_reason == "max_total_tokens"
    assert turn_reason("length", 6, 6) == "length"
    with pytest.raises(RuntimeError, match="finish_reason='abort'"):
        turn_reason("abort", 1, 6)


def test_a_failing_loop_aborts_what_vllm_still_runs():
    engine = FakeEngine({3: [5, STOP], 4: [6, 6, 6, 6, 6, 6]})
    feeder = Feeder({1: [RuntimeError("the loop broke")], 2: [None]})
    with pytest.raises(RuntimeError, match="the loop broke"):
        run(engine, [request(1, 3), request(2, 4, max_new_tokens=6)], feeder, max_total_tokens=20)
    assert len(engine.aborted) == 1 and engine.aborted[0].endswith("-2-0")
    assert not engine.running

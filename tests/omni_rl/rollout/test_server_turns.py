"""A multi-turn generate behind the rollout server (`server/turns.py`): the native engine samples in
the server, the agent loop answers each turn in the client's process.

The server runs in this process here (a thread), over the tiny tools Qwen3 with the `guess_number`
environment making the turns (the random model writes no tool call); `rollout.backend=server`
starts the same server in a process of its own, as a plugin's backend does (the last test)."""
from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.data.prompts import PromptItem
from omni_rl.families.base import build_family
from omni_rl.models.factory import build_model
from omni_rl.rollout.backends import build_rollout_engine
from omni_rl.rollout.base import RolloutEngineError
from omni_rl.rollout.server.app import RolloutServer
from omni_rl.rollout.server.client import ServerRolloutEngine
from omni_rl.rollout.server.turns import TurnSession
from omni_rl.rollout.text_native import NativeTextEngine
from omni_rl.rollout.text_types import TextRequest
from omni_rl.models.autoregressive import PromptInputs

PLUGINS = Path(__file__).resolve().parents[1] / "plugins_for_tests"
TOKEN = "a-test-secret-of-32-characters!!"
AGENT = ["recipe=tiny_qwen3_calculator_agent", "model.path=tiny:qwen3_tools",
         "algo.family_options.agent_options.environment=guess_number", "algo.family_options.agent_options.max_turns=3",
         "algo.family_options.agent_options.max_total_tokens=120",
         "algo.family_options.agent_options.environment_options.high=1000000", "rollout.sampling_options.max_new_tokens=6",
         "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.mini_batch_size=4",
         "trainer.micro_batch_size=4", "rollout.backend=server"]


def serve(engine, multi_turn: bool = True):
    server = RolloutServer(engine, token=TOKEN, multi_turn=multi_turn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, ServerRolloutEngine(server.url, timeout_s=30, rollout_timeout_s=120, token=TOKEN)


@pytest.fixture(scope="module")
def agent():
    cfg = load_config(AGENT)  # an agent run takes rollout.backend=server at load
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    server, client = serve(NativeTextEngine(model, max_num_seqs=4))
    yield cfg, model, build_family(cfg, model), server, client
    server.shutdown()
    server.server_close()


def test_the_server_samples_an_agents_trajectories_and_the_loop_stays_here(agent):
    cfg, model, family, server, client = agent
    batch, _ = family.rollout(client, [PromptItem("7*8", {"secret": 777777}), PromptItem("3*4", {"secret": 888888})],
                              step=1)
    response = batch.attention_mask[:, batch.prompt_width:].bool()
    fed = response & ~batch.response_mask.bool()
    assert fed.any(1).all(), "every trajectory has an environment turn, fed by this process's loop"
    assert (batch.rollout_log_probs[fed] == 0).all()
    for meta in batch.metadata:
        assert meta["trajectory"]["finish_reason"] in ("max_turns", "max_total_tokens", "environment")
    old = family.behaviour_policy(batch, micro_batch_size=4)
    mask = batch.response_mask.bool()
    gap = float((old.log_probs - batch.rollout_log_probs)[mask].abs().max())
    assert gap <= 1e-5, gap
    stats = client.stats
    # Every model turn ended in the server and was answered by this process's loop.
    assert stats["turn_sessions"] == 1
    assert stats["turns_served"] == sum(m["trajectory"]["model_turns"] for m in batch.metadata)
    assert not server.sessions, "a finished session is forgotten"


def request(model, seed: int) -> TextRequest:
    return TextRequest(PromptInputs(torch.tensor(model.encode_text("hi"), dtype=torch.long)), seed=seed,
                       max_new_tokens=3)


class Failing:
    """A handler whose second answer fails (a bug in the trainer's loop)."""

    def __init__(self):
        self.calls = 0

    def end_turn(self, request_id, turn_ids, finish_reason, room) -> Future:
        self.calls += 1
        future: Future = Future()
        if self.calls == 2:
            future.set_exception(RuntimeError("the loop broke"))
        else:
            future.set_result([int(turn_ids[0])] if room > 2 else None)
        return future


def test_a_failing_loop_closes_the_session_and_the_engine_serves_on(agent):
    _, model, _, server, client = agent
    with pytest.raises(RuntimeError, match="the loop broke"):
        client.generate_turns([request(model, 1), request(model, 2)], Failing(), max_total_tokens=12)
    # The session let go of the engine: a plain generate runs, and the session is gone.
    (result,) = client.generate([request(model, 3)])
    assert len(result.response_ids) >= 1
    assert not server.sessions


def test_a_session_nobody_answers_ends_at_its_deadline_and_lets_go_of_the_engine(agent):
    _, model, _, server, _ = agent
    lock = threading.Lock()
    session = TurnSession(server.engine, [request(model, 4), request(model, 5)], 12, timeout_s=0.5, lock=lock)
    assert session.finished.wait(60), "the engine still waits for answers past the session's deadline"
    assert isinstance(session.error, RolloutEngineError) and "timeout_s=0.5" in str(session.error)
    assert lock.acquire(blocking=False)
    with pytest.raises(RolloutEngineError, match="generate_turns failed"):
        session.next(0.0)


def test_a_server_whose_engine_has_no_multi_turn_refuses_a_session(agent):
    _, model, _, _, _ = agent
    server, client = serve(NativeTextEngine(model), multi_turn=False)
    try:
        with pytest.raises(RolloutEngineError, match="does not sample multi-turn trajectories") as err:
            client.generate_turns([request(model, 1)], Failing(), max_total_tokens=8)
        assert "HTTP 400" in str(err.value) and server.url in str(err.value)
    finally:
        server.shutdown()
        server.server_close()


class FeedOnce:
    """Feeds each trajectory its first turn's first token back once, then ends it."""

    def __init__(self):
        self.fed: set[int] = set()

    def end_turn(self, request_id, turn_ids, finish_reason, room) -> Future:
        future: Future = Future()
        first = request_id not in self.fed and room > 1
        self.fed.add(request_id)
        future.set_result([int(turn_ids[0])] if first else None)
        return future


@pytest.mark.long  # a server process of its own: some 20 s on a 2-core CPU
def test_the_server_process_serves_a_plugins_backend_multi_turn_included(monkeypatch):
    # The plugin is importable in the server's Python through PYTHONPATH (the server adds only
    # this checkout); the server loads the run's plugins before it looks its backend up.
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    cfg = load_config(["recipe=tiny_qwen3_grpo", "plugins=[served_backend]", "rollout.backend=tests.served",
                       f"rollout.backend_options.python={sys.executable}"])
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    engine = build_rollout_engine(cfg, model)
    try:
        assert isinstance(engine, ServerRolloutEngine)
        results = engine.generate_turns([request(model, 1), request(model, 2)], FeedOnce(), max_total_tokens=10)
        stats = engine.stats
    finally:
        engine.close()
    assert stats["plugin_engine"] == 1 and stats["turn_sessions"] == 1 and stats["turns_served"] == 4
    for result in results:
        assert 0.0 in result.response_mask.tolist() and result.log_probs[result.response_mask == 0].eq(0).all()

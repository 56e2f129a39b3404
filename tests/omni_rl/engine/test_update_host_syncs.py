"""The update loop reads the device on the host at most twice per mini-batch.

`run_update` over `LocalEngine` and `FSDP2Engine` with the diffusion family (a two-stream model,
flow_grpo and flow_dppo), counted with `HostSyncCounter` (`.item()`, `float(t)`, `bool(t)`):
the engine's one read per optimizer step (were the losses and the gradient norm finite), the
loop's one read of every metric at the end, the family's one check of the batch's sigmas, and
nothing per micro-batch or per denoising step. torch's AdamW reads its `step` counts, which
live on the host beside an accelerator too (no device wait): those reads are left out.
The metrics are the same numbers as before (the first mini-batch's ratio is 1).

A non-finite loss is still refused: found at the optimizer step, the update is skipped and the
weights stay as they were.
"""
from __future__ import annotations

import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.data.diffusion_batch import DiffusionBatch
from omni_rl.engine.fsdp2 import FSDP2Engine
from omni_rl.engine.local import LocalEngine, NonFiniteLossError
from omni_rl.families.diffusion import DiffusionFamily
from omni_rl.families.update import run_update
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.types import DiffusionRequest
from omni_rl.utils.host_syncs import HostSyncCounter

from tests.omni_rl.rollout.two_stream_model import TwoStreamModel

MAX_SYNCS_PER_MINI_BATCH = 2


def request(i: int) -> DiffusionRequest:
    return DiffusionRequest(prompt=f"p{i}", seed=i, height=16, width=16, num_frames=5, num_steps=4, guidance_scale=3.0,
                            kernel="sde", noise_level=0.7, sde_window_size=2, sde_window_range=(0, 3))


def step_batch(model, cfg, family) -> DiffusionBatch:
    engine = NativeDiffusionEngine(model, max_num_seqs=4)
    try:
        results = engine.generate([request(i) for i in range(4)], timeout_s=600)
    finally:
        engine.close()
    batch = DiffusionBatch.from_results(results, [{}] * 4, [0, 0, 1, 1])
    policy = family.behaviour_policy(batch, micro_batch_size=cfg.trainer.micro_batch_size)
    batch.old_log_probs, batch.old_means = policy.log_probs, policy.means
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    return batch


def adam_steps(engine) -> list[torch.Tensor]:
    return [state["step"] for state in engine.optimizer.state.values()]


def config(loss: str):
    return load_config([f"algo.policy_loss={loss}", "trainer.mini_batch_size=2", "trainer.micro_batch_size=1",
                        "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2"])


@pytest.mark.parametrize("loss", ["flow_grpo", "flow_dppo"])
def test_the_local_update_syncs_at_most_twice_per_mini_batch(loss):
    cfg = config(loss)
    model = TwoStreamModel()
    model.net.requires_grad_(True)
    family = DiffusionFamily(cfg, model)
    batch = step_batch(model, cfg, family)
    engine = LocalEngine(model, cfg.optim)
    with HostSyncCounter() as syncs:
        out = run_update(engine, family, batch, cfg, step=1)
    mini_batches = out["num_updates"]
    assert mini_batches == 2
    # 2 mini-batches x 2 micro-batches x 2 window steps = 8 backwards: one read each before.
    assert syncs.count_except(adam_steps(engine)) <= MAX_SYNCS_PER_MINI_BATCH * mini_batches, dict(syncs.ops)
    assert all(isinstance(v, float) for part in ("sums", "maxima") for v in out[part].values())
    assert out["maxima"]["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6
    assert out["sums"]["actor/grad_norm"] > 0 and out["counts"]["actor/grad_norm"] == 2


def test_the_fsdp2_update_syncs_at_most_twice_per_mini_batch(one_rank_group):
    cfg = config("flow_grpo")
    model = TwoStreamModel()
    model.net.requires_grad_(True)
    family = DiffusionFamily(cfg, model)
    batch = step_batch(model, cfg, family)
    engine = FSDP2Engine(model, cfg.optim)
    with HostSyncCounter() as syncs:
        out = run_update(engine, family, batch, cfg, step=1)
    assert out["num_updates"] == 2
    assert syncs.count_except(adam_steps(engine)) <= MAX_SYNCS_PER_MINI_BATCH * 2, dict(syncs.ops)


def test_a_non_finite_loss_skips_the_update_and_keeps_the_weights():
    model = TwoStreamModel()
    model.net.requires_grad_(True)
    engine = LocalEngine(model, config("flow_grpo").optim)
    before = {k: v.clone() for k, v in model.named_trainable_tensors().items()}

    def nan_loss(_):
        loss = sum(p.sum() for p in model.trainable_parameters()) * float("nan")
        return loss, {"loss/total": loss.detach()}

    metrics = engine.forward_backward(None, nan_loss)  # no host read here: found at the step
    assert isinstance(metrics["loss/total"], torch.Tensor)
    with pytest.raises(NonFiniteLossError, match="a loss of this mini-batch is NaN or infinite; the update was skipped"):
        engine.optimizer_step()
    after = model.named_trainable_tensors()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.trainable_parameters())

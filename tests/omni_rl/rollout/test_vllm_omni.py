"""`rollout.backend=vllm_omni` on a GPU: the tiny SD3 through vLLM-Omni (`gpu` marker; skipped
without vllm-omni). Run where it is installed (the CUDA image's /opt/vllm-omni environment):

    OMNI_RL_CACHE=/tmp/omni_rl_cache /opt/vllm-omni/bin/python -m pytest tests/omni_rl/rollout/test_vllm_omni.py -s

- the rollout's log-probs against the trainer's recomputation (the adapter's `predict_velocity`
  and the step kernel scoring the stored transitions): Pearson >= 0.999, the mean |diff| printed;
- kernel `ode`, noise 0: the images equal the native engine's to bf16 tolerance;
- a LoRA update changes the next rollout, and the results record its version;
- sleep mode: `sleep()` frees at least half the served weights' bytes (`torch.cuda.mem_get_info`),
  and after `wake()` the engine samples what it sampled before.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm_omni")

from omni_rl.algos import latent_streams as ls  # noqa: E402
from omni_rl.algos.flow_sde import get_step_kernel, step_latents  # noqa: E402
from omni_rl.compose import bind_blocks  # noqa: E402
from omni_rl.config.schema import ModelConfig, OmniConfig  # noqa: E402
from omni_rl.models import build_model  # noqa: E402
from omni_rl.rollout.backends import build_rollout_engine  # noqa: E402
from omni_rl.rollout.native import NativeDiffusionEngine  # noqa: E402
from omni_rl.rollout.types import DiffusionRequest  # noqa: E402

pytestmark = pytest.mark.gpu


def run_config(path: str, device: str, dtype: str = "float32") -> OmniConfig:
    cfg = OmniConfig()
    cfg.model = ModelConfig(path=path, dtype=dtype)
    cfg.trainer.device = device
    cfg.rollout.backend, cfg.rollout.max_num_seqs = "vllm_omni", 8
    cfg.rollout.backend_options = {"max_wait_ms": 20.0, "enforce_eager": True}
    return bind_blocks(cfg)


def requests(n: int, **overrides) -> list[DiffusionRequest]:
    fields = dict(height=32, width=32, num_steps=6, guidance_scale=4.5, kernel="sde", noise_level=0.7)
    fields.update(overrides)
    return [DiffusionRequest(prompt=f"prompt {i % 3}", seed=i, **fields) for i in range(n)]


@pytest.fixture(scope="module")
def setup(tiny_sd3_path, accel_device):
    cfg = run_config(str(tiny_sd3_path), accel_device)
    torch.manual_seed(cfg.trainer.seed)
    trainer = build_model(cfg.model, torch.device(accel_device))
    engine = build_rollout_engine(cfg, trainer)  # sends the trainer's LoRA as version 0
    yield trainer, engine
    engine.close()


@torch.no_grad()
def trainer_log_probs(model, result) -> torch.Tensor:
    x, steps = result.latents, len(result.log_probs)
    cond = result.conditioning
    out = []
    for k in range(steps):
        sample = ls.to(ls.index(x, k)[None], model.device)
        nxt = ls.to(ls.index(x, k + 1)[None], model.device)
        sigma, sigma_next = result.sigmas[k : k + 1].to(model.device), result.sigmas_next[k : k + 1].to(model.device)
        velocity = model.predict_velocity(sample, sigma, cond, result.guidance_scale)
        step = step_latents(get_step_kernel(result.kernel), model_output=velocity, sample=sample, prev_sample=nxt,
                            sigma=sigma, sigma_next=sigma_next, noise_level=result.noise_levels[k : k + 1].to(model.device))
        out.append(step.log_prob.float().cpu()[0])
    return torch.stack(out)


def test_rollout_log_probs_match_the_trainers(setup):
    trainer, engine = setup
    results = engine.generate(requests(16), timeout_s=600)
    rollout = torch.cat([r.log_probs for r in results])
    recomputed = torch.cat([trainer_log_probs(trainer, r) for r in results])
    pearson = float(torch.corrcoef(torch.stack([rollout, recomputed]))[0, 1])
    mean_abs = float((rollout - recomputed).abs().mean())
    print(f"vllm_omni rollout vs trainer log-probs: pearson={pearson:.6f} mean_abs_diff={mean_abs:.3e} "
          f"over {rollout.numel()} steps")
    assert pearson >= 0.999, (pearson, mean_abs)


def test_noise_free_images_equal_the_native_engines(setup):
    trainer, engine = setup
    reqs = requests(4, kernel="ode", noise_level=0.0)
    served = engine.generate(reqs, timeout_s=600)
    native_engine = NativeDiffusionEngine(trainer, max_num_seqs=8)
    try:
        native = native_engine.generate(requests(4, kernel="ode", noise_level=0.0), timeout_s=600)
    finally:
        native_engine.close()
    for a, b in zip(served, native):
        diff = (a.image.float() - b.image.float()).abs().max()
        assert diff <= 2, f"pixel difference {diff} (uint8) between vllm_omni and native"  # bf16-level rounding
        torch.testing.assert_close(a.final_latent, b.final_latent, rtol=1e-2, atol=1e-2)


def test_a_lora_update_changes_the_next_rollout(setup):
    trainer, engine = setup
    before = engine.generate(requests(2), timeout_s=600)
    with torch.no_grad():
        for p in trainer.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.sync_weights(trainer, 7)
    after = engine.generate(requests(2), timeout_s=600)
    assert all(r.weight_version == 7 for r in after)
    assert not torch.equal(before[0].final_latent, after[0].final_latent)


def test_sleep_frees_the_weights_and_wake_samples_as_before(setup, accel_device):
    if not accel_device.startswith("cuda"):
        pytest.skip("torch.cuda.mem_get_info needs CUDA")
    trainer, engine = setup
    reqs = requests(2, kernel="ode", noise_level=0.0)
    before = engine.generate(reqs, timeout_s=600)
    weight_bytes = sum(t.numel() * t.element_size() for m in [*trainer.trainable_modules().values(),
                                                               *trainer.frozen_modules()] for t in m.parameters())
    awake, _ = torch.cuda.mem_get_info()
    engine.sleep()
    asleep, _ = torch.cuda.mem_get_info()
    engine.wake()
    print(f"vllm_omni sleep: freed {(asleep - awake) / 2**20:.1f} MiB for {weight_bytes / 2**20:.1f} MiB of weights")
    assert asleep - awake >= 0.5 * weight_bytes, "sleep() left the weights resident"
    after = engine.generate(requests(2, kernel="ode", noise_level=0.0), timeout_s=600)
    for a, b in zip(before, after):
        torch.testing.assert_close(a.final_latent, b.final_latent, rtol=0, atol=0)

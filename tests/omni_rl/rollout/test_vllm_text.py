"""`rollout.backend=vllm` on a GPU: the tiny Qwen3 with 32-wide heads (`tiny:qwen3_hd32`: vLLM's
attention backends take no head_dim of 8) through vLLM (`gpu` marker; skipped without vllm). Its
CPU counterpart is `test_vllm_cpu.py`. Run where it is installed (the CUDA image's /opt/vllm-omni environment):

    OMNI_RL_CACHE=/tmp/omni_rl_cache /opt/vllm-omni/bin/python -m pytest tests/omni_rl/rollout/test_vllm_text.py -s

- vLLM's per-token log-probs at the sampling temperature against the trainer's
  (`token_log_probs` of the same sequences): Pearson >= 0.999, the mean |diff| printed; with
  LoRA in bf16 on both sides (vLLM's LoRA kernels take fp16 / bf16 only), and in float32 with
  full-weight sync (through `vllm_worker.py`), before and after an update;
- a LoRA update changes the next rollout and the results record its version;
- `close()` stops vLLM's engine core: the GPU memory it took is free again.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from omni_rl.compose import bind_blocks  # noqa: E402
from omni_rl.config.schema import ModelConfig, OmniConfig  # noqa: E402
from omni_rl.models import build_model  # noqa: E402
from omni_rl.rollout.backends import build_rollout_engine  # noqa: E402
from tests.omni_rl.rollout.vllm_text_requests import requests, trainer_log_probs  # noqa: E402

pytestmark = pytest.mark.gpu


def text_config(accel_device: str, dtype: str, lora: bool) -> OmniConfig:
    cfg = OmniConfig()
    cfg.model = ModelConfig(adapter="Qwen3ForCausalLM", path="tiny:qwen3_hd32", dtype=dtype)
    cfg.model.lora.enabled = lora
    cfg.trainer.device = accel_device
    cfg.rollout.backend, cfg.rollout.backend_options = "vllm", {"enforce_eager": True, "gpu_memory_utilization": 0.3}
    return bind_blocks(cfg)


def start(cfg: OmniConfig):
    torch.manual_seed(cfg.trainer.seed)
    trainer = build_model(cfg.model, torch.device(cfg.trainer.device))
    return trainer, build_rollout_engine(cfg, trainer)


@pytest.fixture(scope="module")
def setup(accel_device):
    """LoRA, in bf16 on both sides."""
    trainer, engine = start(text_config(accel_device, "bfloat16", lora=True))
    yield trainer, engine
    engine.close()


@pytest.fixture(scope="module")
def full_setup(accel_device):
    """Full fine-tuning in float32: weights go through vllm_worker.py."""
    trainer, engine = start(text_config(accel_device, "float32", lora=False))
    yield trainer, engine
    engine.close()


def test_rollout_log_probs_match_the_trainers(setup):
    trainer, engine = setup
    results = engine.generate(requests(trainer, 16))
    rollout = torch.cat([r.log_probs for r in results])
    recomputed = torch.cat([trainer_log_probs(trainer, r) for r in results])
    pearson = float(torch.corrcoef(torch.stack([rollout, recomputed]))[0, 1])
    mean_abs = float((rollout - recomputed).abs().mean())
    print(f"vllm rollout vs trainer log-probs: pearson={pearson:.6f} mean_abs_diff={mean_abs:.3e} "
          f"over {rollout.numel()} tokens")
    assert pearson >= 0.999, (pearson, mean_abs)


def test_a_lora_update_changes_the_next_rollout(setup):
    trainer, engine = setup
    before = engine.generate(requests(trainer, 4))
    with torch.no_grad():
        for p in trainer.trainable_parameters():
            p.add_(0.5 * torch.randn_like(p))
    engine.sync_weights(trainer, 5)
    after = engine.generate(requests(trainer, 4))
    assert all(r.weight_version == 5 for r in after)
    assert any(not torch.equal(a.log_probs, b.log_probs) for a, b in zip(before, after))


def log_prob_agreement(trainer, engine, n: int = 16) -> tuple[float, float]:
    results = engine.generate(requests(trainer, n))
    rollout = torch.cat([r.log_probs for r in results])
    recomputed = torch.cat([trainer_log_probs(trainer, r) for r in results])
    return float(torch.corrcoef(torch.stack([rollout, recomputed]))[0, 1]), float((rollout - recomputed).abs().mean())


def test_float32_full_weights_match_the_trainer_before_and_after_an_update(full_setup):
    trainer, engine = full_setup
    before = engine.generate(requests(trainer, 4))
    pearson, mean_abs = log_prob_agreement(trainer, engine)
    print(f"vllm float32 full weights: pearson={pearson:.6f} mean_abs_diff={mean_abs:.3e}")
    assert pearson >= 0.999, (pearson, mean_abs)
    with torch.no_grad():
        for p in trainer.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.sync_weights(trainer, 3)
    after = engine.generate(requests(trainer, 4))
    assert all(r.weight_version == 3 for r in after)
    assert any(not torch.equal(a.log_probs, b.log_probs) for a, b in zip(before, after))
    pearson, mean_abs = log_prob_agreement(trainer, engine)
    print(f"vllm float32 full weights after a sync: pearson={pearson:.6f} mean_abs_diff={mean_abs:.3e}")
    assert pearson >= 0.999, (pearson, mean_abs)


def test_close_gives_the_engines_gpu_memory_back(accel_device):
    if not accel_device.startswith("cuda"):
        pytest.skip("torch.cuda.mem_get_info needs CUDA")
    free_before, total = torch.cuda.mem_get_info()
    _, engine = start(text_config(accel_device, "bfloat16", lora=True))
    free_running, _ = torch.cuda.mem_get_info()
    engine.close()
    free_after, _ = torch.cuda.mem_get_info()
    print(f"vllm engine: took {(free_before - free_running) / 2**30:.2f} GiB, "
          f"left {(free_before - free_after) / 2**30:.2f} GiB after close")
    assert free_before - free_running > 0.2 * total  # gpu_memory_utilization=0.3 of it was taken
    assert free_before - free_after < 2 * 2**30, "close() left the engine core's memory behind"

"""FSDP2 over NCCL (HCCL on Ascend) on one accelerator worker (`gpu` marker: CUDA by default, see
tests/conftest.py): the tiny Qwen3 recipe on 1 Ray worker gives the losses and final weights of
one process on the same device, and bf16 mixed precision with optimizer offload runs.

One device is enough for these checks; several-worker equivalence is covered on CPUs (gloo) by
test_ray_trainer.py."""
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from omni_rl.compose import load_config
from omni_rl.models.loading import resolve_model_path
from omni_rl.trainer import PPOTrainer

pytestmark = pytest.mark.gpu

BASE = ["recipe=tiny_qwen3_grpo", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", "trainer.val_every=0",
        "trainer.total_steps=3", "trainer.micro_batch_size=8", "rollout.sampling_options.max_new_tokens=8",
        "model.lora.enabled=true", "optim.lr=1e-2"]
RAY = ["trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=1"]


def train(out, *overrides):
    PPOTrainer(load_config([*BASE, f"trainer.output_dir={out}", *overrides])).fit()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_one_worker_matches_one_process(tmp_path, ray_local, accel_device):
    resolve_model_path("tiny:qwen3")
    local = train(tmp_path / "local", f"trainer.device={accel_device}")
    dist = train(tmp_path / "ray", f"trainer.device={accel_device}", *RAY)
    for a, b in zip(local, dist):
        for key in ("loss/total", "actor/grad_norm", "reward/total/mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key
    weights = "lora/adapter_model.safetensors"
    want, got = load_file(tmp_path / "local" / weights), load_file(tmp_path / "ray" / weights)
    assert sorted(want) == sorted(got)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


def test_bf16_mixed_precision_with_optimizer_offload(tmp_path, ray_local, accel_device):
    records = train(tmp_path / "bf16", f"trainer.device={accel_device}", *RAY, "model.dtype=bfloat16",
                    "trainer.engine_options.optimizer_offload=true")
    assert len(records) == 3
    for rec in records:
        assert all(math.isfinite(rec[k]) for k in ("loss/total", "actor/grad_norm", "reward/total/mean")), rec
    assert (tmp_path / "bf16" / "lora" / "adapter_model.safetensors").is_file()

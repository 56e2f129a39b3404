"""Routing replay on 2 Ray workers (FSDP2 over gloo): the rollout's routes travel with the batch
to the workers, which replay them; the losses match one process's on the same seeds."""
import json

import pytest

from omni_rl.compose import load_config
from omni_rl.models.loading import resolve_model_path
from omni_rl.trainer import PPOTrainer

BASE = [
    "recipe=tiny_qwen3_moe_grpo", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]",
    "trainer.val_every=0", "trainer.save_every=0", "trainer.total_steps=2", "trainer.prompts_per_step=2",
    "trainer.samples_per_prompt=4", "trainer.mini_batch_size=8", "trainer.micro_batch_size=4",
    "algo.family_options.max_new_tokens=8", "algo.family_options.routing_replay=r3",
]
RAY = ["trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2"]


def train(out, *overrides):
    PPOTrainer(load_config([*BASE, f"trainer.output_dir={out}", *overrides])).fit()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_r3_on_two_workers_matches_one_process(tmp_path, ray_local):
    resolve_model_path("tiny:qwen3_moe")
    local = train(tmp_path / "local")
    dist = train(tmp_path / "ray", *RAY)
    assert len(local) == len(dist) == 2
    for a, b in zip(local, dist):
        for key in ("loss/total", "actor/grad_norm", "reward/total/mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-5), key
        assert b["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6

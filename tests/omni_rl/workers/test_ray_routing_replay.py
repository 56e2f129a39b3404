"""Routing replay on 2 Ray workers (FSDP2 over gloo): under r3 the rollout's routes travel with the
batch to the workers, which replay them; under r2 the routes each rank's old-policy forward used
come back to the driver and go with the batch to the update (whose rows may land on another rank).
The losses match one process's on the same seeds."""
import json

import pytest

from omni_rl.compose import load_config
from omni_rl.models.loading import resolve_model_path
from omni_rl.trainer import PPOTrainer

BASE = [
    "recipe=tiny_qwen3_moe_grpo", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]",
    "trainer.val_every=0", "trainer.save_every=0", "trainer.total_steps=2", "trainer.prompts_per_step=2",
    "trainer.samples_per_prompt=4", "trainer.mini_batch_size=8", "trainer.micro_batch_size=4",
    "rollout.sampling_options.max_new_tokens=8",
]
RAY = ["trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2"]


def train(out, *overrides):
    PPOTrainer(load_config([*BASE, f"trainer.output_dir={out}", *overrides])).fit()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# r2 under `long` (about 45 s on a loaded 2-core machine): the default run's budget is spent.
@pytest.mark.parametrize("mode", ["r3", pytest.param("r2", marks=pytest.mark.long)])
def test_routing_replay_on_two_workers_matches_one_process(tmp_path, ray_local, mode):
    resolve_model_path("tiny:qwen3_moe")
    replay = f"algo.family_options.routing_replay={mode}"
    local = train(tmp_path / "local", replay)
    dist = train(tmp_path / "ray", replay, *RAY)
    assert len(local) == len(dist) == 2
    for a, b in zip(local, dist):
        for key in ("loss/total", "actor/grad_norm", "reward/total/mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-5), key
        assert b["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6

"""Reward workers on Ray: the same rewards as in-process, failures named, never a hang or a 0."""
import json
import uuid

import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.reward.manager import RewardError, RewardManager, RewardSpec
from omni_rl.trainer import PPOTrainer
from omni_rl.workers.ray_cluster import init_local_ray
from omni_rl.workers.reward_worker import RayRewardManager


def images(n):
    return torch.randint(0, 256, (n, 16, 16, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)


def test_reward_workers_score_like_the_local_manager(ray_local):
    specs = [RewardSpec("brightness", 1.0), RewardSpec("jpeg_compressibility", 0.5)]
    remote = RayRewardManager(specs, num_workers=2, timeout_s=120)
    try:
        imgs, prompts = images(6), [f"p{i}" for i in range(6)]
        local = RewardManager(specs).score(imgs, prompts)
        for _ in range(2):  # both workers, round robin
            out = remote.score(imgs, prompts)
            torch.testing.assert_close(out.total, local.total)
            assert out.metrics == pytest.approx(local.metrics)
    finally:
        remote.close()


def test_a_failing_required_reward_on_a_worker_names_the_reward(ray_local, tmp_path, monkeypatch):
    name = f"broken_{uuid.uuid4().hex[:8]}"
    module = tmp_path / f"plugin_{name}.py"
    module.write_text(
        "from omni_rl.reward import register_reward\n"
        f"@register_reward('{name}')\n"
        "def broken():\n"
        "    def score(samples, prompts, metadata):\n"
        "        raise RuntimeError('judge unreachable')\n"
        "    return score\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import ray

    # The workers import the plugin module by name: restart Ray with its folder on their path.
    ray.shutdown()
    init_local_ray(2, runtime_env={"env_vars": {"PYTHONPATH": str(tmp_path)}})
    remote = RayRewardManager([RewardSpec(name)], plugins=[module.stem], num_workers=1, timeout_s=120)
    try:
        with pytest.raises(RewardError, match=name):
            remote.score(images(2), ["a", "b"])
    finally:
        remote.close()


def test_a_dead_reward_worker_fails_the_call_naming_it(ray_local):
    import ray

    if not ray.is_initialized():
        init_local_ray(2)
    remote = RayRewardManager([RewardSpec("brightness")], num_workers=1, timeout_s=60)
    ray.kill(remote.workers[0], no_restart=True)
    with pytest.raises(RewardError, match=r"reward worker 0 \(node .*, pid \d+\) died"):
        remote.score(images(2), ["a", "b"])
    remote.close()


def test_trainer_with_reward_workers(tmp_path, ray_local):
    import ray

    if not ray.is_initialized():
        init_local_ray(2)
    out = tmp_path / "run"
    cfg = load_config(["recipe=tiny_qwen3_grpo", f"trainer.output_dir={out}", "trainer.total_steps=2",
                       "trainer.val_every=0", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]",
                       "reward.worker_options.num_workers=1", "reward.worker_options.num_cpus=0.5"])
    PPOTrainer(cfg).fit()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and 0.0 <= records[0]["reward/char_match/mean"] <= 1.0

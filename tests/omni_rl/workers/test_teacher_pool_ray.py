"""A pooled teacher with the Ray backend: each training rank finds the pool's actors by name (the
trainer starts its own local Ray here, sized for the ranks and the pool, so no shared fixture)."""
import json

import pytest

from omni_rl.compose import load_config
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import TINY_SD3


@pytest.mark.long  # a 2-rank Ray run beside a pool actor: about two minutes on 2 busy cores
def test_two_ranks_share_one_teacher_pool(tmp_path):
    pytest.importorskip("ray")
    trainer = PPOTrainer(load_config([
        *TINY_SD3, "trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2",
        "algo.policy_loss=distill_kl", "trainer.total_steps=1", "trainer.val_every=0",
        "algo.family_options.teachers=[{name: base, placement: pool}]", f"trainer.output_dir={tmp_path / 'run'}"]))
    trainer.fit()
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # The pool's teacher is the student's base; the student's LoRA starts at 0: float rounding.
    assert 0 <= record["distill/base/kl"] < 1e-4 and record["timing/teacher"] > 0

"""`reward.overlap_rollout`: null scores in the waiting thread only where the run has one
computing thread (one process, on-policy, the native engine, the CPU); true and false stay."""
import pytest

from omni_rl.compose import load_config
from omni_rl.trainer.reward_overlap import rewards_overlap_rollout

RECIPE = "tiny_sd3_flowgrpo"


@pytest.mark.parametrize("extra,overlaps", [
    ([], False),  # the demo's kind of run: one computing thread
    (["reward.overlap_rollout=true"], True),
    (["trainer.pipeline=one_step_off"], True),  # the engine's thread samples beside the update on purpose
    (["trainer.pipeline=async"], True),
    (["rollout.backend=server"], True),  # the rollout computes in a process of its own
    (["trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2"], True),
    (["reward.worker_options.num_workers=1"], True),
])
def test_null_overlaps_only_where_something_else_computes_the_rollout(extra, overlaps):
    cfg = load_config([f"recipe={RECIPE}", *extra])
    assert cfg.reward.overlap_rollout in (None, True)
    assert rewards_overlap_rollout(cfg) is overlaps


def test_false_is_kept_where_null_would_overlap():
    cfg = load_config([f"recipe={RECIPE}", "trainer.pipeline=one_step_off", "reward.overlap_rollout=false"])
    assert rewards_overlap_rollout(cfg) is False

"""Whether rewards are scored beside the rollout: `reward.overlap_rollout`, with null resolved.

Scoring in `AsyncRewardScorer`'s thread pays where something else computes the rollout (a GPU,
Ray workers, a rollout server, a pipelined engine thread). In a one-process on-policy CPU run a
scorer thread would be a second computing thread whose OpenMP team slows the one that samples
(docs/rollout.md), so null scores there after the rollout, and overlaps everywhere else.
"""
from __future__ import annotations

from omni_rl.config.schema import OmniConfig


def rewards_overlap_rollout(cfg: OmniConfig) -> bool:
    """`reward.overlap_rollout` resolved (module docstring)."""
    chosen = cfg.reward.overlap_rollout
    if chosen is not None:
        return bool(chosen)
    from omni_rl.device import pick_device

    one_computing_thread = (
        cfg.trainer.pipeline == "on_policy"
        and cfg.trainer.backend == "local"
        and cfg.rollout.backend == "native"
        and cfg.reward.worker_options.num_workers == 0
        and pick_device(cfg.trainer.device).type == "cpu"
    )
    return not one_computing_thread


__all__ = ["rewards_overlap_rollout"]

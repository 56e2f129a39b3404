"""Whether rewards are scored beside the rollout: `reward.overlap_rollout`, with null resolved.

Scoring beside the rollout (`AsyncRewardScorer`'s thread) pays where something else computes
the rollout: a GPU, Ray workers, a rollout server's process, or an engine thread that runs
beside the update on purpose (`trainer.pipeline` one_step_off / async); reward workers score in
processes of their own anyway. In a one-process on-policy run on the CPU the native engine samples
in the thread that waits for it (`rollout.options.driver=auto`), and a scorer thread would be a
second computing thread: once it has run a torch op it keeps an OpenMP team of its own, whose
idle threads slow every parallel region of the team that samples and updates (docs/rollout.md).
There null scores each batch in the waiting thread, after its rollout; everywhere else null
overlaps. true and false are kept as set.
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
        and cfg.reward.workers.num_workers == 0
        and pick_device(cfg.trainer.device).type == "cpu"
    )
    return not one_computing_thread


__all__ = ["rewards_overlap_rollout"]

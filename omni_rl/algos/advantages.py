"""Group-relative advantage estimators: rewards of N samples -> one advantage per sample.

Contract (every estimator, registered in `ADVANTAGE_ESTIMATORS`):

    fn(inp: AdvantageInput) -> Tensor [N] float32

Samples generated from one prompt share a `group_index` value; a baseline is formed inside each
group, so no value network is needed. The estimators are vectorised (index_add over compacted
group ids, no python loop over groups) and deterministic. A group of size 1 has no baseline
to compare against: its advantage is 0 for every estimator.

The advantage is one number per sample; the trainer broadcasts it over the sample's denoising
steps (diffusion) or tokens (text). Clipping to +-adv_clip_max happens in the policy loss.

Standard deviations are POPULATION stds (divide by n, `unbiased=False`), as numpy's default
`np.std` that Flow-GRPO's per-prompt stat tracker uses; that keeps a group of two samples with
rewards {0, 1} at advantages {-1, +1} (up to eps) rather than +-0.707.

Not here: reward weighting and aggregation (the reward manager), filtering of zero-variance
groups (dynamic sampling belongs to the trainer), running statistics across steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from omni_rl.registry import Registry

__all__ = [
    "AdvantageInput",
    "AdvantageEstimator",
    "ADVANTAGE_ESTIMATORS",
    "STD_MODES",
    "get_advantage_estimator",
    "grpo_advantage",
    "dr_grpo_advantage",
    "rloo_advantage",
]

STD_MODES = ("group", "global", "none")


@dataclass
class AdvantageInput:
    """Inputs of an advantage estimator.

    rewards:     `[N]` float, one scalar reward per sample; must be finite.
    group_index: `[N]` integer; samples of one prompt share a value (any integers, need not be
                 contiguous or sorted).
    std_mode:    grpo's normaliser: "group" (std within the sample's group), "global" (std over
                 all N rewards; Flow-GRPO's default) or "none" (no division). Estimators that never
                 divide (dr_grpo, rloo) ignore it.
    eps:         added to the std before dividing (> 0), so a group whose rewards are all equal
                 gets advantage 0 rather than 0/0.
    """

    rewards: Tensor
    group_index: Tensor
    std_mode: str
    eps: float = 1e-4

    def __post_init__(self) -> None:
        if self.std_mode not in STD_MODES:
            raise ValueError(f"std_mode={self.std_mode!r} is not one of {', '.join(STD_MODES)}")
        if not (isinstance(self.eps, (int, float)) and self.eps > 0):
            raise ValueError(f"eps={self.eps!r}; expected a float > 0 (Flow-GRPO uses 1e-4)")
        if self.rewards.ndim != 1 or self.group_index.ndim != 1:
            raise ValueError(
                f"rewards {tuple(self.rewards.shape)} and group_index {tuple(self.group_index.shape)} "
                f"must both be 1-D [N]; flatten them to one entry per sample."
            )
        if self.rewards.shape[0] != self.group_index.shape[0]:
            raise ValueError(
                f"rewards has {self.rewards.shape[0]} entries but group_index has "
                f"{self.group_index.shape[0]}; pass one group index per reward."
            )
        index_dtype = self.group_index.dtype
        if index_dtype.is_floating_point or index_dtype.is_complex or index_dtype == torch.bool:
            raise TypeError(
                f"group_index has dtype {self.group_index.dtype}; expected an integer tensor "
                f"(e.g. torch.long), one prompt id per sample."
            )
        if not self.rewards.dtype.is_floating_point:
            raise TypeError(f"rewards has dtype {self.rewards.dtype}; expected a float tensor")
        finite = torch.isfinite(self.rewards)
        if not bool(finite.all()):
            i = int((~finite).nonzero()[0, 0])
            raise ValueError(
                f"reward of sample {i} is {float(self.rewards[i])!r}; rewards must be finite. "
                f"Check the reward function for that sample (a failed scorer must raise, not return NaN)."
            )


AdvantageEstimator = Callable[[AdvantageInput], Tensor]

ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The registered estimator called `name` (`grpo`, `dr_grpo`, `rloo`)."""
    return ADVANTAGE_ESTIMATORS.get(name)


def _group_stats(inp: AdvantageInput) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(rewards fp32 [N], group id per sample [N] in 0..G-1, group sizes [G], group sums [G])."""
    rewards = inp.rewards.to(torch.float32)
    # Compact arbitrary prompt ids to 0..G-1 so the per-group tensors have exactly G rows.
    _, gid = torch.unique(inp.group_index.to(rewards.device), return_inverse=True)
    num_groups = int(gid.max()) + 1 if gid.numel() else 0
    counts = torch.zeros(num_groups, device=rewards.device, dtype=torch.float32).index_add_(
        0, gid, torch.ones_like(rewards)
    )
    sums = torch.zeros(num_groups, device=rewards.device, dtype=torch.float32).index_add_(0, gid, rewards)
    return rewards, gid, counts, sums


def _centred(inp: AdvantageInput) -> tuple[Tensor, Tensor, Tensor]:
    """(r - mean_group(r) [N], group id [N], group sizes [G])."""
    rewards, gid, counts, sums = _group_stats(inp)
    group_mean = sums / counts
    return rewards - group_mean[gid], gid, counts


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantage(inp: AdvantageInput) -> Tensor:
    """GRPO: A_i = (r_i - mean_group(r)) / (std + eps).

    std is the population std of r within i's group ("group") or of all N rewards ("global");
    "none" skips the division (then grpo equals dr_grpo). A group of size 1 has r_i - mean = 0,
    hence A = 0 in every mode.
    """
    centred, gid, counts = _centred(inp)
    if inp.std_mode == "none":
        return centred
    if inp.std_mode == "global":
        std = inp.rewards.to(torch.float32).std(unbiased=False) if centred.numel() else centred.new_zeros(())
        return centred / (std + inp.eps)
    group_var = torch.zeros_like(counts).index_add_(0, gid, centred**2) / counts
    return centred / (group_var.sqrt()[gid] + inp.eps)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo_advantage(inp: AdvantageInput) -> Tensor:
    """Dr. GRPO: A_i = r_i - mean_group(r), never divided by a std (std_mode is ignored)."""
    centred, _, _ = _centred(inp)
    return centred


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantage(inp: AdvantageInput) -> Tensor:
    """REINFORCE leave-one-out: A_i = r_i - mean_{j != i, j in group(i)} r_j.

    The baseline excludes the sample itself, so it is independent of r_i. With n the group
    size and S its sum, the baseline is (S - r_i) / (n - 1); equivalently
    A_i = n / (n - 1) * (r_i - mean_group(r)). Size-1 groups get 0. std_mode is ignored.
    """
    rewards, gid, counts, sums = _group_stats(inp)
    n = counts[gid]
    others = torch.where(n > 1, n - 1, torch.ones_like(n))
    advantage = rewards - (sums[gid] - rewards) / others
    return torch.where(n > 1, advantage, torch.zeros_like(advantage))

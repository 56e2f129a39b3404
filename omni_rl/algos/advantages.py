"""Group-relative advantage estimators: rewards of N samples -> one advantage per sample.

Every estimator in `ADVANTAGE_ESTIMATORS` is `fn(inp: AdvantageInput) -> Tensor [N]`, with the
baseline formed inside each `group_index` group; a group of one, or of equal rewards, gets 0.
Not here: reward weighting, clipping (the loss), filtering groups (the trainer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from omni_rl.option import ComponentOptions
from omni_rl.registry import Registry

__all__ = [
    "AdvantageOptions",
    "AdvantageInput",
    "AdvantageEstimator",
    "AdvantageSpec",
    "ADVANTAGE_ESTIMATORS",
    "STD_MODES",
    "get_advantage_estimator",
    "register_advantage_estimator",
    "needs_group",
    "grpo_advantage",
    "dr_grpo_advantage",
    "rloo_advantage",
]

STD_MODES = ("group", "global", "none")


@dataclass
class AdvantageOptions(ComponentOptions):
    """The estimators' options (`algo.advantage_options`); an estimator that never divides by a
    std (dr_grpo, rloo) reads neither `std_mode` nor `eps`. `max_uniform_steps` is the trainer's
    (`omni_rl.trainer.no_signal`): how long every advantage may be zero."""

    std_mode: str = field(default="global", metadata={
        "doc": "grpo's normaliser: group (per-prompt std), global (batch std; Flow-GRPO) or none."})
    eps: float = field(default=1e-4, metadata={"doc": "Added to the std before dividing (> 0; Flow-GRPO: 1e-4)."})
    max_uniform_steps: int = field(default=10, metadata={
        "doc": "Steps in a row in which every group's samples score the same (every advantage 0: no signal) before the "
               "run stops with an error naming the rewards; each such step warns; 0 = never stop."})

    def check(self) -> None:
        if self.std_mode not in STD_MODES:
            raise ValueError(f"std_mode={self.std_mode!r}: expected one of {', '.join(STD_MODES)}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"eps={self.eps!r}: expected a finite value > 0 (Flow-GRPO uses 1e-4)")
        if self.max_uniform_steps < 0:
            raise ValueError(f"max_uniform_steps={self.max_uniform_steps!r}: expected >= 1 steps, or 0 to never stop")


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


@dataclass(frozen=True)
class AdvantageSpec:
    """What an estimator declares at registration (its registry entry's spec)."""

    needs_group: bool  # a group-relative baseline: a group of one gets A = 0

ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The registered estimator called `name` (`grpo`, `dr_grpo`, `rloo`)."""
    return ADVANTAGE_ESTIMATORS.get(name)


def register_advantage_estimator(
    name: str, *, needs_group: bool
) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: register an estimator under `name`, declaring whether it needs groups of >= 2.

    needs_group=True: the estimator compares a sample with the other samples of its prompt (a
    group mean or a leave-one-out baseline), so in a group of one every advantage is 0 and
    training does nothing; the config then rejects trainer.samples_per_prompt=1. False: its
    baseline does not come from the group (a batch mean, a learned value), so groups of one work.
    """

    return ADVANTAGE_ESTIMATORS.register(name, spec=AdvantageSpec(needs_group=needs_group))


def needs_group(name: str) -> bool:
    """Whether the estimator `name` needs groups of >= 2 samples (raises for an unknown name).

    An estimator registered with `ADVANTAGE_ESTIMATORS.register` directly declared nothing; this
    module's contract is group-relative, so it counts as needing a group.
    """
    spec = ADVANTAGE_ESTIMATORS.spec(name)
    return True if spec is None else spec.needs_group


def _group_stats(inp: AdvantageInput) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(rewards fp32 [N]; group id per sample [N] in 0..G-1; group sizes [G]; group sums [G];
    whether the sample's group is uniform, i.e. all its rewards are equal [N] bool).

    A uniform group must get advantage exactly 0, which float32 means do not give (docs/algorithms.md
    works an example): the estimators zero uniform groups explicitly (max == min is exact) and
    compute every other group as they would.
    """
    rewards = inp.rewards.to(torch.float32)
    # Compact arbitrary prompt ids to 0..G-1 so the per-group tensors have exactly G rows.
    _, gid = torch.unique(inp.group_index.to(rewards.device), return_inverse=True)
    num_groups = int(gid.max()) + 1 if gid.numel() else 0
    zeros = torch.zeros(num_groups, device=rewards.device, dtype=torch.float32)
    counts = zeros.clone().index_add_(0, gid, torch.ones_like(rewards))
    sums = zeros.clone().index_add_(0, gid, rewards)
    group_max = torch.full_like(zeros, -torch.inf).scatter_reduce_(0, gid, rewards, reduce="amax")
    group_min = torch.full_like(zeros, torch.inf).scatter_reduce_(0, gid, rewards, reduce="amin")
    uniform = (group_max == group_min)[gid]
    return rewards, gid, counts, sums, uniform


def _centred(inp: AdvantageInput) -> tuple[Tensor, Tensor, Tensor]:
    """(r - mean_group(r) [N], group id [N], group sizes [G]); exactly 0 in a uniform group."""
    rewards, gid, counts, sums, uniform = _group_stats(inp)
    group_mean = sums / counts
    centred = rewards - group_mean[gid]
    return torch.where(uniform, torch.zeros_like(centred), centred), gid, counts


@register_advantage_estimator("grpo", needs_group=True)
def grpo_advantage(inp: AdvantageInput) -> Tensor:
    """GRPO: A_i = (r_i - mean_group(r)) / (std + eps).

    std is the population std of r within i's group ("group") or of all N rewards ("global");
    "none" skips the division (then grpo equals dr_grpo). A group of size 1 has r_i - mean = 0,
    hence A = 0 in every mode: needs_group in every mode, since even "global" and "none" centre
    on the group mean.
    """
    centred, gid, counts = _centred(inp)
    if inp.std_mode == "none":
        return centred
    if inp.std_mode == "global":
        std = inp.rewards.to(torch.float32).std(unbiased=False) if centred.numel() else centred.new_zeros(())
        return centred / (std + inp.eps)
    group_var = torch.zeros_like(counts).index_add_(0, gid, centred**2) / counts
    return centred / (group_var.sqrt()[gid] + inp.eps)


@register_advantage_estimator("dr_grpo", needs_group=True)
def dr_grpo_advantage(inp: AdvantageInput) -> Tensor:
    """Dr. GRPO: A_i = r_i - mean_group(r), never divided by a std (std_mode is ignored).

    needs_group: the baseline is the group mean, so a group of one gets A = 0.
    """
    centred, _, _ = _centred(inp)
    return centred


@register_advantage_estimator("rloo", needs_group=True)
def rloo_advantage(inp: AdvantageInput) -> Tensor:
    """REINFORCE leave-one-out: A_i = r_i - mean_{j != i, j in group(i)} r_j.

    The baseline excludes the sample itself, so it is independent of r_i. With n the group
    size and S its sum, the baseline is (S - r_i) / (n - 1); equivalently
    A_i = n / (n - 1) * (r_i - mean_group(r)). std_mode is ignored. needs_group: the baseline
    needs at least one other sample, so size-1 groups get 0.
    """
    rewards, gid, counts, sums, uniform = _group_stats(inp)
    n = counts[gid]
    others = torch.where(n > 1, n - 1, torch.ones_like(n))
    advantage = rewards - (sums[gid] - rewards) / others
    return torch.where((n > 1) & ~uniform, advantage, torch.zeros_like(advantage))

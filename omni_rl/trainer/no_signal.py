"""Steps with no learning signal: in every group, every sample scored the same.

Such a step updates nothing; many in a row mean the reward cannot tell samples apart.
`NoSignalWatch.observe` warns on each uniform step and after
`algo.advantage_options.max_uniform_steps` in a row (0 = never) raises `NoSignalError`. A group
is uniform when its spread is within fp32 round-off (`UNIFORM_TOLERANCE`).
"""
from __future__ import annotations

import logging
from typing import Mapping

import torch

from omni_rl.errors import OmniRunError

log = logging.getLogger(__name__)

UNIFORM_TOLERANCE = 1e-6
_CHECK = ("check the rewards' settings (a speech reward's language and text_key, a length target every sample reaches, "
          "the model a reward loads) and that the samples differ (all cut at the length cap?)")


class NoSignalError(OmniRunError):
    """`max_uniform_steps` steps in a row whose groups were all uniform."""


def all_groups_uniform(total: torch.Tensor, group_index: torch.Tensor) -> bool:
    """Whether every group's rewards `total` [N] (groups by `group_index` [N]) are equal, within
    the module's tolerance."""
    total = total.detach().to(torch.float64).cpu()
    _, groups = torch.unique(group_index.cpu(), return_inverse=True)
    n = int(groups.max()) + 1
    high = torch.full((n,), -torch.inf, dtype=torch.float64).scatter_reduce(0, groups, total, "amax")
    low = torch.full((n,), torch.inf, dtype=torch.float64).scatter_reduce(0, groups, total, "amin")
    scale = max(1.0, float(total.abs().max()))
    return bool(((high - low) <= UNIFORM_TOLERANCE * scale).all())


def describe_rewards(per_reward: Mapping[str, torch.Tensor]) -> str:
    """Each reward and its values: `asr_wer = 0 on all 8 samples`, or its range."""
    parts = []
    for name, scores in per_reward.items():
        low, high = float(scores.min()), float(scores.max())
        if high - low <= UNIFORM_TOLERANCE * max(1.0, abs(low), abs(high)):
            parts.append(f"{name} = {low:.4g} on all {scores.numel()} samples")
        else:
            parts.append(f"{name} in [{low:.4g}, {high:.4g}], equal within each group")
    return "; ".join(parts) or "no reward scored"


class NoSignalWatch:
    def __init__(self, max_uniform_steps: int, key: str = "algo.advantage_options.max_uniform_steps"):
        self.max_uniform_steps = max_uniform_steps
        self.key = key
        self.run = 0  # uniform steps in a row, up to this one

    def observe(self, step: int, total: torch.Tensor, group_index: torch.Tensor,
                per_reward: Mapping[str, torch.Tensor]) -> None:
        """Count step `step`: warn when its groups are all uniform; raise `NoSignalError` on the
        `max_uniform_steps`-th such step in a row."""
        if not all_groups_uniform(total, group_index):
            self.run = 0
            return
        self.run += 1
        groups = int(torch.unique(group_index).numel())
        values = describe_rewards(per_reward)
        if self.max_uniform_steps and self.run >= self.max_uniform_steps:
            raise NoSignalError(
                f"steps {step - self.run + 1}-{step}: no learning signal {self.run} steps in a row ({self.key}="
                f"{self.max_uniform_steps}): in each group every sample scored the same ({values}), so every "
                f"advantage was zero and nothing trained; {_CHECK}; or set {self.key}=0 to go on regardless"
            )
        stop = f"the run stops at {self.max_uniform_steps}, {self.key}" if self.max_uniform_steps else f"{self.key}=0: never stops"
        log.warning(
            "step %d: no learning signal: in each of the %d groups every sample scored the same (%s), so every "
            "advantage is zero and this update does nothing; %s (%d such step(s) in a row; %s)",
            step, groups, values, _CHECK, self.run, stop,
        )

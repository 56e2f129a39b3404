"""`ThinkDrawBatch`: a step's think-then-draw samples, as the trainer loop and the think-draw family pass them.

N samples, each R plan tokens then the K trained steps of its image (a whole `DiffusionBatch`,
whose rewards and advantages are the sample's); the trainer's log-probs are `[N, R + K]`, plan
first. The plan half:

  prompts        the N prompts (the plan's context is rebuilt from them)
  plan_ids       [N, R] long   the sampled plan tokens, right-padded
  plan_mask      [N, R] float  1 on the sampled tokens (the end-of-plan token included)
  plan_rollout_log_probs [N, R] fp32  the sampling's log-probs (meaningless where the mask is 0)
  plans          the decoded plans (the rewards' metadata["plan"])
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import torch

from omni_rl.data.diffusion_batch import DiffusionBatch


@dataclass
class ThinkDrawBatch:
    prompts: list[str]
    plan_ids: torch.Tensor
    plan_mask: torch.Tensor
    plan_rollout_log_probs: torch.Tensor
    plans: list[str]
    plan_temperature: float
    image: DiffusionBatch
    rewards: Optional[torch.Tensor] = None
    advantages: Optional[torch.Tensor] = None
    old_log_probs: Optional[torch.Tensor] = None
    old_means: Optional[torch.Tensor] = None
    rollout_is_weights: Optional[torch.Tensor] = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.prompts)
        shapes = {"plan_ids": self.plan_ids.shape, "plan_mask": self.plan_mask.shape,
                  "plan_rollout_log_probs": self.plan_rollout_log_probs.shape}
        if len({tuple(s) for s in shapes.values()}) != 1 or self.plan_ids.shape[0] != n or len(self.image) != n:
            raise ValueError(f"a think-draw batch of {n} prompts needs [N, R] plan tensors and an image batch of N, "
                             f"got {shapes} and {len(self.image)} images")

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def plan_width(self) -> int:
        """R: the plan's columns, where the trajectory's image steps start."""
        return self.plan_ids.shape[1]

    @property
    def rollout_log_probs(self) -> torch.Tensor:
        image = self.image.rollout_log_probs  # where rollout.backend_options.trajectory_device put it
        return torch.cat([self.plan_rollout_log_probs.to(image.device), image], dim=1)

    @property
    def group_index(self) -> torch.Tensor:
        return self.image.group_index

    @property
    def weight_versions(self) -> Optional[torch.Tensor]:
        return self.image.weight_versions

    @property
    def metadata(self) -> list[dict[str, Any]]:
        return self.image.metadata

    def action_mask(self) -> torch.Tensor:
        """[N, R + K]: the plan's mask, then 1 for every trained image step."""
        image = self.image.rollout_log_probs
        return torch.cat([self.plan_mask.to(image.device), torch.ones_like(image)], dim=1)

    def image_half(self) -> DiffusionBatch:
        """The image's batch with the trajectory's per-sample values and its own columns of the
        per-action ones (what the diffusion family's loss reads)."""
        r = self.plan_width
        cut = lambda t: None if t is None else t[:, r:]  # noqa: E731
        return replace(self.image, rewards=self.rewards, advantages=self.advantages,
                       old_log_probs=cut(self.old_log_probs), rollout_is_weights=cut(self.rollout_is_weights),
                       old_means=None)

    def select(self, index: Sequence[int] | torch.Tensor) -> "ThinkDrawBatch":
        idx = torch.as_tensor(index, dtype=torch.long)
        ids = idx.tolist()
        pick = lambda t: None if t is None else t.index_select(0, idx)  # noqa: E731
        return replace(
            self, prompts=[self.prompts[i] for i in ids], plan_ids=pick(self.plan_ids), plan_mask=pick(self.plan_mask),
            plan_rollout_log_probs=pick(self.plan_rollout_log_probs), plans=[self.plans[i] for i in ids],
            image=self.image.select(idx), rewards=pick(self.rewards), advantages=pick(self.advantages),
            old_log_probs=pick(self.old_log_probs), old_means=None, rollout_is_weights=pick(self.rollout_is_weights),
        )

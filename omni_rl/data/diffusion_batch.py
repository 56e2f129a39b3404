"""`DiffusionBatch`: a step's samples, stacked, as the trainer loop and the diffusion family pass them along.

N samples (prompts x samples_per_prompt), each with W trained (window) steps:

  latents        [N, W + 1, *latent]  x before each window step, then after the last (fp32)
  rollout_log_probs [N, W]            log-probs the rollout engine computed while sampling
  old_log_probs  [N, W]               behaviour-policy log-probs used in the ratio
  old_means      [N, W, *latent]      behaviour-policy transition means (Flow-DPPO, Guard)
  sigmas, sigmas_next, noise_levels [N, W]
  conditioning   Conditioning of N
  rewards, advantages [N];  group_index [N] (samples of one prompt share it)
  images         uint8 [N, H, W, C]
  final_latents  [N, *latent]  the clean latents (latent reward models score these)
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import torch

from omni_rl.models.conditioning import Conditioning
from omni_rl.rollout.types import DiffusionResult


@dataclass
class DiffusionBatch:
    prompts: list[str]
    metadata: list[dict[str, Any]]
    group_index: torch.Tensor
    latents: torch.Tensor
    rollout_log_probs: torch.Tensor
    sigmas: torch.Tensor
    sigmas_next: torch.Tensor
    noise_levels: torch.Tensor
    conditioning: Conditioning
    images: torch.Tensor
    final_latents: torch.Tensor
    guidance_scale: float
    kernel: str
    rewards: Optional[torch.Tensor] = None
    advantages: Optional[torch.Tensor] = None
    old_log_probs: Optional[torch.Tensor] = None
    old_means: Optional[torch.Tensor] = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.latents.shape[0]

    @property
    def num_train_steps(self) -> int:
        return self.rollout_log_probs.shape[1]

    @staticmethod
    def from_results(
        results: Sequence[DiffusionResult], metadata: Sequence[dict[str, Any]], group_index: Sequence[int]
    ) -> "DiffusionBatch":
        widths = {r.log_probs.shape[0] for r in results}
        if len(widths) != 1:
            raise ValueError(f"samples of one batch must train the same number of steps, got {sorted(widths)}")
        return DiffusionBatch(
            prompts=[r.prompt for r in results],
            metadata=[dict(m) for m in metadata],
            group_index=torch.as_tensor(list(group_index), dtype=torch.long),
            latents=torch.stack([r.latents for r in results]),
            rollout_log_probs=torch.stack([r.log_probs for r in results]),
            sigmas=torch.stack([r.sigmas for r in results]),
            sigmas_next=torch.stack([r.sigmas_next for r in results]),
            noise_levels=torch.stack([r.noise_levels for r in results]),
            conditioning=Conditioning.cat([r.conditioning for r in results]),
            images=torch.stack([r.image for r in results]),
            final_latents=torch.stack([r.final_latent for r in results]),
            guidance_scale=results[0].guidance_scale,
            kernel=results[0].kernel,
        )

    def select(self, index: Sequence[int] | torch.Tensor) -> "DiffusionBatch":
        idx = torch.as_tensor(index, dtype=torch.long)
        pick = lambda t: None if t is None else t.index_select(0, idx)  # noqa: E731
        ids = idx.tolist()
        return replace(
            self,
            prompts=[self.prompts[i] for i in ids],
            metadata=[self.metadata[i] for i in ids],
            group_index=pick(self.group_index),
            latents=pick(self.latents),
            rollout_log_probs=pick(self.rollout_log_probs),
            sigmas=pick(self.sigmas),
            sigmas_next=pick(self.sigmas_next),
            noise_levels=pick(self.noise_levels),
            conditioning=self.conditioning.select(idx),
            images=pick(self.images),
            final_latents=pick(self.final_latents),
            rewards=pick(self.rewards),
            advantages=pick(self.advantages),
            old_log_probs=pick(self.old_log_probs),
            old_means=pick(self.old_means),
        )

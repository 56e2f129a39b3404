"""`DiffusionBatch`: a step's samples, stacked, as the trainer loop and the diffusion family pass them along.

N samples (prompts x samples_per_prompt), each with W stochastic (window) steps of which it
trains K (all W, or DanceGRPO's per-sample subset: `step_index`):

  latents        [N, W + 1, *latent]  x before each window step, then after the last (fp32)
  step_index     [N, K] or None       which window steps are trained (None: all, in order)
  rollout_log_probs [N, K]            log-probs the rollout engine computed while sampling
  old_log_probs  [N, K]               behaviour-policy log-probs used in the ratio
  old_means      [N, K, *latent]      behaviour-policy transition means (Flow-DPPO, Guard)
  rollout_is_weights [N, K] or None   rollout-correction weights of the policy loss (algo.rollout_correction_options.level)
  sigmas, sigmas_next, noise_levels [N, K]
  conditioning   Conditioning of N
  rewards, advantages [N];  group_index [N] (samples of one prompt share it)
  weight_versions [N] long            the weight version each sample was rolled out with (-1: unknown)
  sample_seeds   [N] long or None     each sample's request seed (the forward-process losses' draws)
  images         uint8 [N, H, W, C], or [N, T, H, W, C] for video
  final_latents  [N, *latent]  the clean latents (latent reward models score these)
  audio          float [N, channels, samples] at sample_rate (audio-video models), else None
  latents of several streams (video + audio) are `LatentStreams` of the shapes above
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import torch

from omni_rl.models.conditioning import Conditioning
from omni_rl.rollout.base import weight_versions_of
from omni_rl.rollout.types import DiffusionResult
from omni_rl.algos import latent_streams as ls


@dataclass
class DiffusionBatch:
    prompts: list[str]
    metadata: list[dict[str, Any]]
    group_index: torch.Tensor
    latents: ls.Latents
    rollout_log_probs: torch.Tensor
    sigmas: torch.Tensor
    sigmas_next: torch.Tensor
    noise_levels: torch.Tensor
    conditioning: Conditioning
    images: torch.Tensor
    final_latents: ls.Latents
    guidance_scale: float
    kernel: str
    rewards: Optional[torch.Tensor] = None
    advantages: Optional[torch.Tensor] = None
    old_log_probs: Optional[torch.Tensor] = None
    old_means: Optional[ls.Latents] = None
    rollout_is_weights: Optional[torch.Tensor] = None
    step_index: Optional[torch.Tensor] = None
    fps: float = 16.0
    audio: Optional[torch.Tensor] = None
    sample_rate: Optional[int] = None
    weight_versions: Optional[torch.Tensor] = None
    sample_seeds: Optional[torch.Tensor] = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def num_train_steps(self) -> int:
        return self.rollout_log_probs.shape[1]

    def step_latents(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x before, x after) the j-th trained step of every sample."""
        if self.step_index is None:
            return ls.index(self.latents, j, dim=1), ls.index(self.latents, j + 1, dim=1)
        rows = torch.arange(len(self))
        k = self.step_index[:, j]
        return ls.take(self.latents, rows, k), ls.take(self.latents, rows, k + 1)

    @staticmethod
    def from_results(
        results: Sequence[DiffusionResult], metadata: Sequence[dict[str, Any]], group_index: Sequence[int],
        step_index: Optional[torch.Tensor] = None,
    ) -> "DiffusionBatch":
        """Stack the results; `step_index` [N, K] (window steps to train per sample) keeps only
        those steps' log-probs, sigmas and noise levels."""
        widths = {r.log_probs.shape[0] for r in results}
        if len(widths) != 1:
            raise ValueError(f"samples of one batch must train the same number of steps, got {sorted(widths)}")
        batch = DiffusionBatch(
            prompts=[r.prompt for r in results],
            metadata=[dict(m) for m in metadata],
            group_index=torch.as_tensor(list(group_index), dtype=torch.long),
            latents=ls.stack([r.latents for r in results]),
            rollout_log_probs=torch.stack([r.log_probs for r in results]),
            sigmas=torch.stack([r.sigmas for r in results]),
            sigmas_next=torch.stack([r.sigmas_next for r in results]),
            noise_levels=torch.stack([r.noise_levels for r in results]),
            conditioning=Conditioning.cat([r.conditioning for r in results]),
            images=torch.stack([r.image for r in results]),
            final_latents=ls.stack([r.final_latent for r in results]),
            guidance_scale=results[0].guidance_scale,
            kernel=results[0].kernel,
            fps=results[0].fps,
            audio=torch.stack([r.audio for r in results]) if results[0].audio is not None else None,
            sample_rate=results[0].sample_rate,
            weight_versions=weight_versions_of(results),
        )
        if step_index is None:
            return batch
        take = lambda t: t.gather(1, step_index.to(t.device))  # noqa: E731 (trajectories may live on the device)
        return replace(
            batch, step_index=step_index, rollout_log_probs=take(batch.rollout_log_probs), sigmas=take(batch.sigmas),
            sigmas_next=take(batch.sigmas_next), noise_levels=take(batch.noise_levels),
        )

    def select(self, index: Sequence[int] | torch.Tensor) -> "DiffusionBatch":
        idx = torch.as_tensor(index, dtype=torch.long)
        pick = lambda t: None if t is None else ls.select(t, idx)  # noqa: E731
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
            audio=pick(self.audio),
            final_latents=pick(self.final_latents),
            rewards=pick(self.rewards),
            advantages=pick(self.advantages),
            old_log_probs=pick(self.old_log_probs),
            old_means=pick(self.old_means),
            rollout_is_weights=pick(self.rollout_is_weights),
            step_index=pick(self.step_index),
            weight_versions=pick(self.weight_versions),
            sample_seeds=pick(self.sample_seeds),
        )

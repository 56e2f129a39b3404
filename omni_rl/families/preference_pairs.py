"""Preference pairs for Diffusion-DPO: which samples pair up, and the batch of pairs the update trains.

Online, each group's highest-reward sample wins over its lowest (the first of equal ones); a group
whose rewards are all equal gives no pair. `PairBatch` holds P pairs (winner's and loser's clean
latents, the prompt's conditioning, one seed for their shared draws) and is `select`-able like a
`DiffusionBatch`, so the batch sizes count pairs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from omni_rl.algos import latent_streams as ls
from omni_rl.models.conditioning import Conditioning


def best_worst_pairs(rewards: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(winner indices [P], loser indices [P]) of the groups whose rewards are not all equal, in
    group order."""
    if rewards.shape != group_index.shape or rewards.ndim != 1:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_index {tuple(group_index.shape)}: expected two [N] tensors"
        )
    winners, losers = [], []
    for group in torch.unique(group_index).tolist():  # sorted
        members = torch.nonzero(group_index == group).flatten()
        scores = rewards[members]
        if bool(scores.max() == scores.min()):
            continue
        winners.append(int(members[torch.argmax(scores)]))
        losers.append(int(members[torch.argmin(scores)]))
    return torch.tensor(winners, dtype=torch.long), torch.tensor(losers, dtype=torch.long)


@dataclass
class PairBatch:
    """P preference pairs.

    chosen, rejected: [P, *latent] clean latents of the winner and the loser (fp32)
    conditioning:     Conditioning of P (the pair's prompt)
    seeds:            [P] int64, the seed of each pair's shared (t, eps) draws
    guidance_scale:   the CFG scale of the velocity (the rollout's)
    prompts:          [P] the prompts
    """

    chosen: ls.Latents
    rejected: ls.Latents
    conditioning: Conditioning
    seeds: torch.Tensor
    guidance_scale: float
    prompts: list[str]

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, index: Sequence[int] | torch.Tensor) -> "PairBatch":
        idx = torch.as_tensor(index, dtype=torch.long)
        return PairBatch(
            chosen=ls.select(self.chosen, idx), rejected=ls.select(self.rejected, idx),
            conditioning=self.conditioning.select(idx), seeds=self.seeds.index_select(0, idx),
            guidance_scale=self.guidance_scale, prompts=[self.prompts[i] for i in idx.tolist()],
        )

    @staticmethod
    def from_images(model, prompts: list[str], chosen: torch.Tensor, rejected: torch.Tensor, seeds: torch.Tensor,
                    guidance_scale: float, negative_prompt: str = "") -> "PairBatch":
        """Offline pairs: uint8 images [P, H, W, C] encoded through the model's VAE
        (`encode_images`), the prompts through its text encoders."""
        return PairBatch(
            chosen=model.encode_images(chosen), rejected=model.encode_images(rejected),
            conditioning=model.encode_prompts(prompts, negative_prompt), seeds=seeds.to(torch.long),
            guidance_scale=guidance_scale, prompts=list(prompts),
        )

    @staticmethod
    def from_rollout(batch) -> "PairBatch":
        """The best-vs-worst pair of every group of a scored `DiffusionBatch` (rewards set)."""
        if batch.rewards is None or batch.sample_seeds is None:
            raise ValueError("PairBatch.from_rollout needs a scored batch with sample seeds (rewards, sample_seeds)")
        winners, losers = best_worst_pairs(batch.rewards, batch.group_index)
        return PairBatch(
            chosen=ls.select(batch.final_latents, winners), rejected=ls.select(batch.final_latents, losers),
            conditioning=batch.conditioning.select(winners), seeds=batch.sample_seeds.index_select(0, winners),
            guidance_scale=batch.guidance_scale, prompts=[batch.prompts[i] for i in winners.tolist()],
        )

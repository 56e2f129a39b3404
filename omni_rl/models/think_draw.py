"""`ThinkDrawModelBase`: the contract of models that write a plan as text, then draw an image from it.

Adds the text half to `DiffusionModelBase`: `sample_plans`, `plan_log_probs` (teacher forced, the
same function for rollout and trainer), `encode_prompts_with_plans` and `decode_plan`. Plans are
padded to `max_new_tokens` columns, so a log-prob does not depend on its batch-mates.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch

from omni_rl.models.conditioning import Conditioning
from omni_rl.models.diffusion import DiffusionModelBase


def plan_token(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    """One plan token from a row's next-token logits [V]: the argmax at temperature 0, else drawn
    from softmax(logits / temperature) with the sample's generator (the trainer scores it later)."""
    if temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


class ThinkDrawModelBase(DiffusionModelBase):
    family: ClassVar[str] = "think_draw"

    @abstractmethod
    def sample_plans(self, prompts: list[str], seeds: list[int], max_new_tokens: int,
                     temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(plan_ids [B, max_new_tokens] long, plan_mask [B, max_new_tokens] float), on the CPU."""

    @abstractmethod
    def plan_log_probs(self, prompts: list[str], plan_ids: torch.Tensor, plan_mask: torch.Tensor,
                       temperature: float) -> torch.Tensor:
        """[B, R] fp32 log-probs of the plan tokens (carries the graph when grad is enabled)."""

    @abstractmethod
    def encode_prompts_with_plans(self, prompts: list[str], plan_ids: torch.Tensor, plan_mask: torch.Tensor,
                                  negative_prompt: str = "") -> Conditioning:
        """The image's conditioning of each (prompt, plan)."""

    @abstractmethod
    def decode_plan(self, ids: list[int]) -> str:
        """A plan's token ids (the sampled ones) as text."""

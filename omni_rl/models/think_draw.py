"""`ThinkDrawModelBase`: the contract of models that write a plan as text, then draw an image from it.

One trajectory has two kinds of action: the plan's tokens (sampled from the model's language
head) and the image's denoising steps (a flow-matching generator conditioned on the prompt and
the plan). Everything of `DiffusionModelBase` holds for the image; this class adds the text half:

1. `sample_plans(prompts, seeds, max_new_tokens, temperature)` -> (plan_ids [B, R] long,
   plan_mask [B, R] float): one plan per prompt, each from a generator seeded by its own seed
   alone (so a plan is the same whatever it is batched with); temperature 0 is greedy
   (validation). The mask is 1 on every sampled token, the end-of-plan token included when it
   was sampled; the plan is cut at `max_new_tokens` otherwise.
2. `plan_log_probs(prompts, plan_ids, plan_mask, temperature)` -> [B, R] fp32, teacher-forced:
   `log_softmax(logits / temperature)[token]` of each plan token after the prompt and the plan's
   earlier tokens. The SAME function gives the rollout's log-probs (under no_grad, right after
   sampling) and the trainer's, so on-policy their ratio is 1. Entries where the mask is 0 are
   meaningless and masked by the caller.
3. `encode_prompts_with_plans(prompts, plan_ids, plan_mask, negative_prompt)` -> `Conditioning`
   of B: the image's context holds the prompt and the plan (and the CFG contexts, as the model's
   own think mode builds them). The family hands it to the rollout engine as each request's
   precomputed conditioning (`DiffusionRequest.conditioning`), so the engines stay unchanged.
4. `decode_plan(ids)`: the plan's text (shown in validation grids and given to the rewards).

Widths: an adapter pads plans to `max_new_tokens` columns, so every forward over plans has the
same shape whatever micro-batch it is in (a log-prob must not depend on its batch-mates).
"""
from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch

from omni_rl.models.conditioning import Conditioning
from omni_rl.models.diffusion import DiffusionModelBase


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

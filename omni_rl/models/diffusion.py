"""`DiffusionModelBase`: the contract of flow-matching generators (image, video, audio).

The rollout engine and the trainer call the same four methods, so sampling and training use
identical maths:

1. `sigmas(num_steps)`: the noise schedule, [num_steps + 1] fp32 ending in 0;
2. `encode_prompts(prompts, negative_prompt)`: a `Conditioning` with the positive and (for
   classifier-free guidance) negative embeddings of each prompt;
3. `predict_velocity(latents, sigma, conditioning, guidance_scale)`: the transformer forward
   with CFG applied, per-sample sigma [B], returning the velocity in fp32;
4. `decode(latents)`: clean latents -> uint8 pixels [B, H, W, C] (video: [B, T, H, W, C]).

Latent shapes are whatever the model uses (`latent_shape`); nothing here assumes images.
"""
from __future__ import annotations

import copy
from abc import abstractmethod
from typing import ClassVar

import torch

from omni_rl.models.base import OmniModelBase
from omni_rl.models.conditioning import Conditioning


class DiffusionModelBase(OmniModelBase):
    family: ClassVar[str] = "diffusion"
    scheduler = None  # a diffusers FlowMatchEulerDiscreteScheduler, set by the adapter

    def sigmas(self, num_steps: int) -> torch.Tensor:
        """The schedule's sigmas for `num_steps` denoising steps, [num_steps + 1] fp32 (last 0).

        A copy of the scheduler is used so that asking never changes the adapter's state."""
        cache = self.__dict__.setdefault("_sigma_cache", {})
        if num_steps not in cache:
            scheduler = copy.deepcopy(self.scheduler)
            scheduler.set_timesteps(num_steps, device="cpu")
            cache[num_steps] = scheduler.sigmas.detach().to(torch.float32).cpu()
        return cache[num_steps]

    @abstractmethod
    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """Shape of one sample's latent (no batch dim) for an output of height x width."""

    @abstractmethod
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        """Embeddings for each prompt (and the negative prompt, for CFG), batch first."""

    @abstractmethod
    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor, conditioning: Conditioning, guidance_scale: float
    ) -> torch.Tensor:
        """Velocity v = x_1 - x_0 at (latents, sigma [B]) with CFG, fp32, shape of `latents`."""

    @abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Clean latents -> uint8 pixels, channels last."""

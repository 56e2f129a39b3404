"""FLUX.1-Kontext instruction-based image editing (`FluxKontextPipeline`: FLUX.1-Kontext-dev): the adapter.

The same components and conventions as FLUX.1 (adapters/flux.py: latents, sigma as the timestep,
the dynamic-shift schedule of the *noise* tokens, the distilled guidance embedding, true CFG only
with a negative prompt, T5 + CLIP pooled text, 2x2 packing), plus the source image, which enters
as the pipeline feeds it:

- its VAE latent (the distribution's mode, normalised as the noise latents are) is packed into
  tokens and appended after the noise tokens along the sequence, with position ids of its own
  grid whose first channel is 1 (the pipeline's `image_ids[..., 0] = 1`; the noise tokens' is 0);
- the transformer sees both, and only the noise tokens' output is the velocity: the source
  tokens are the same clean latent at every step (never noised, never stepped);
- the text does not see the image: the prompt embeddings are FLUX's.

The image is encoded once per (instruction, image), at admission, and travels in the sample's
`Conditioning` (`image_latents` [B, S_img, 64] and `image_grid` [B, 2], the condition's packed
token grid), so training replays exactly what the rollout saw.

**The condition's size.** The pipeline's own `__call__` resizes the source image to the Kontext
training resolution closest to its aspect ratio (`PREFERRED_KONTEXT_RESOLUTIONS`, about one
megapixel) and renders about one megapixel (`max_area`) whatever the requested size. Here the
source image is resized to `model.adapter_options.condition_image_size` ([height, width], default the
output's size) by the pipeline's own image processor and encoded at that size, and the output has
the requested size. Given a source image already at the condition size, `_auto_resize=False` and
`max_area` = the output's area, the pipeline and the adapter compute the same thing (the tests run
exactly that).

Its tiny models are in `adapters/tiny/flux_kontext.py`,
its view for the planner in `adapters/plan/flux_kontext.py`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from omni_rl.option import option
from omni_rl.models import Conditioning, register_adapter
from omni_rl.models.diffusion import EditingOptions, check_multiple

from adapters.flux import PACK, FluxAdapter, FluxOptions, image_ids, pack_latents, unpack_latents


@dataclass
class FluxKontextOptions(FluxOptions, EditingOptions):
    """FLUX.1's knobs (`max_sequence_length`, `guidance`) and the editing models' `condition_image_size`."""

    condition_image_size: Optional[list[int]] = option(None, "[height, width] in px the source image is resized to and encoded at (through the VAE: its tokens follow the noise tokens); null = the output's size (rollout.sampling_options.height, rollout.sampling_options.width). Rollout and training see the same encoding.")


@register_adapter("FluxKontextPipeline")
class FluxKontextAdapter(FluxAdapter):
    takes_source_image = True
    options_class = FluxKontextOptions

    @classmethod
    def check_config(cls, cfg) -> None:
        """The output size (as FLUX.1) and `model.adapter_options.condition_image_size`: multiples of 16."""
        super().check_config(cfg)
        size = cfg.model.adapter_options.condition_image_size
        if size is not None:
            for i, value in enumerate(size):
                check_multiple(f"model.adapter_options.condition_image_size[{i}]", value, cls.size_multiple,
                               "what FluxKontextPipeline takes")

    def _pipeline_class(self):
        from diffusers import FluxKontextPipeline

        return FluxKontextPipeline

    # --- the source image ----------------------------------------------------------------
    def condition_size(self, height: int, width: int) -> tuple[int, int]:
        """[height, width] in px the source image is encoded at (`model.adapter_options.condition_image_size`,
        else the output's size); a multiple of 16 on both sides."""
        size = self.options.condition_image_size
        h, w = (height, width) if size is None else (int(size[0]), int(size[1]))
        factor = self.vae_scale * PACK
        why = f"VAE factor {self.vae_scale} x the 2x2 packing"
        check_multiple("model.adapter_options.condition_image_size[0]" if size else "rollout.sampling_options.height", h, factor, why)
        check_multiple("model.adapter_options.condition_image_size[1]" if size else "rollout.sampling_options.width", w, factor, why)
        return h, w

    def condition_images(self, images, height: int, width: int):
        """The prompt's source image, resized by the pipeline's image processor to
        `condition_size`, as uint8 [H, W, 3]."""
        if not images:
            raise ValueError("FluxKontextPipeline edits a source image: the prompt has none")
        if len(images) > 1:
            raise ValueError(f"FluxKontextPipeline takes one source image per prompt, got {len(images)}")
        h, w = self.condition_size(height, width)
        resized = self.pipeline.image_processor.resize(images[0].convert("RGB"), h, w)
        return (torch.from_numpy(np.asarray(resized, dtype=np.uint8).copy()),)

    @torch.no_grad()
    def encode_image_latents(self, images: list) -> torch.Tensor:
        """Source images (PIL, all one size) -> packed normalised VAE latents [B, S_img, C*4] (the
        distribution's mode, `(z - shift) * scale`, as the pipeline's `_encode_vae_image`)."""
        w, h = images[0].size
        pixels = self.pipeline.image_processor.preprocess(images, h, w)
        z = self.vae.encode(pixels.to(self.device, self.vae.dtype)).latent_dist.mode()
        config = self.vae.config
        return pack_latents(((z - config.shift_factor) * config.scaling_factor).to(torch.float32))

    # --- conditioning --------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "", images=None) -> Conditioning:
        """FLUX's text tensors (adapters/flux.py) and each prompt's source image (`images[i]`: the
        request's one condition image, uint8) as packed latents with its token grid."""
        from PIL import Image

        if images is None or len(images) != len(prompts):
            got = "none" if images is None else len(images)
            raise ValueError(f"FluxKontextPipeline needs a source image for every prompt: {len(prompts)} prompts, "
                             f"{got} image groups")
        pils = []
        for i, group in enumerate(images):
            if not group or len(group) != 1:
                raise ValueError(f"prompt {i} ({prompts[i]!r}): expected 1 condition image, got {0 if not group else len(group)}")
            image = group[0]
            if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[-1] != 3:
                raise ValueError(f"a condition image is a uint8 [H, W, 3] tensor, got {image.dtype} {tuple(image.shape)}")
            pils.append(Image.fromarray(image.cpu().numpy()))
        sizes = {im.size for im in pils}
        if len(sizes) != 1:
            raise ValueError(f"the prompts of one call must have source images of one size, got {sorted(sizes)} "
                             f"((width, height))")
        tensors = self._text_tensors(list(prompts), negative_prompt)
        tensors["image_latents"] = self.encode_image_latents(pils).to(tensors["prompt_embeds"].device)
        factor = self.vae_scale * PACK
        w, h = pils[0].size
        tensors["image_grid"] = torch.tensor([[h // factor, w // factor]] * len(prompts), dtype=torch.long,
                                             device=tensors["prompt_embeds"].device)
        return Conditioning(tensors)

    # --- forward -------------------------------------------------------------------------
    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        """Velocity (fp32, [B, C, h, w]) of the noise tokens, the source image's tokens appended
        after them with their own position ids (module docstring)."""
        b, _, h, w = latents.shape
        sigma = sigma.to(torch.float32).reshape(-1).to(self.device)
        if sigma.shape[0] != b:
            raise ValueError(f"sigma has {sigma.shape[0]} values for a batch of {b} latents")
        cond = conditioning.to(self.device)
        grids = {tuple(g) for g in cond["image_grid"].tolist()}
        if len(grids) != 1:
            raise ValueError(f"one forward takes source images of one size, got token grids {sorted(grids)}")
        (rows, cols), = grids
        noise = pack_latents(latents.to(self.device, torch.float32))
        tokens = torch.cat([noise, cond["image_latents"].to(torch.float32)], dim=1)
        ids = torch.cat([image_ids(h, w), image_ids(rows * PACK, cols * PACK, first=1.0)])
        out = self._guided(tokens, sigma, cond, ids, guidance_scale, noise.shape[1])
        return unpack_latents(out, h, w)

"""BAGEL image editing (`model.adapter=BagelForConditionalGeneration model.stage=edit`): the adapter.

A stage rather than a name of its own because one checkpoint does both: a BAGEL folder's
`config.json` names `BagelForConditionalGeneration` whatever it is used for, so the task is
picked the way an omni model's trained stage is, and the folder still names its adapter.

Everything of text-to-image (adapters/bagel/adapter.py: latents, schedule, prompt format, text
CFG, what trains, the exports) plus the source image, which conditions twice, as the official
editing inference (`InterleaveInferencer` on [image, instruction]) feeds it. Each sample's
context is, in order (adapters/bagel/layout.py):

1. the **VAE block** `<|vision_start|> latents <|vision_end|>` at RoPE position 0: the source's
   clean latent in BAGEL's space (`scale (z - shift)`), 2x2 patches, through `vae2llm` + the time
   embedding of t = 0 + `latent_pos_embed`, on the generation expert (the official
   `prepare_vae_images` / `forward_cache_update_vae`);
2. the **ViT block** at position 1: the SigLIP tower's features (adapters/bagel/vision.py: the
   official `vit_transform` of the same condition image) through `connector` + `vit_pos_embed`,
   on the understanding expert (`prepare_vit_images` / `forward_cache_update_vit`);
3. the instruction `<|im_start|> ... <|im_end|>` from position 2, then the image being made.

**The condition image.** The source is resized (bicubic, as the official torchvision resize of a
PIL image) to `model.adapter_options.condition_image_size` ([height, width], default the output's size) and both
encodings are made from it once per (instruction, negative prompt, image), when the request is
admitted; they travel in the sample's `Conditioning` (`image_latents` [B, M, 64], `image_grid`
[B, 2], `vit_features` [B, K, D_vit], `vit_positions` [B, K]), so training replays exactly what
the rollout saw. The official code resizes the source by its own rule (long side <= 1024, short
side >= 512, multiples of 16) and generates at that size: the two agree for a source given at a
size that rule keeps. The official VAE encoder samples its posterior; here it is the posterior's
mean, a condition that replays exactly (FLUX's posterior is narrow).

**CFG** (the official `_forward_flow`), three branches in one forward: the conditional c (image
+ instruction); for the samples whose sigma lies in `model.adapter_options.cfg_interval`, the
text-unconditional u (the image alone: the official `cfg_text_precontext`; with
`rollout.sampling_options.negative_prompt` the image and that text) and, when `model.adapter_options.image_guidance_scale`
> 1, the image-unconditional ui (the instruction alone: the official `cfg_img_precontext`).
`t = u + g (c - u)`, `v = ui + g_img (t - ui)`, rescaled toward |c| (clamped to
[`model.adapter_options.cfg_renorm_min`, 1]) as `model.adapter_options.cfg_renorm_type` says (`guided_velocity`):
the official edit demo (app.py's `edit_image`, inference.ipynb's editing cells) and its GEdit,
ImgEdit and KRIS evaluations use "text_channel" (per token, t rescaled before image CFG); the
option's default stays the inferencer's "global", so an editing recipe names its renorm. As in
the official code image CFG applies only together with text CFG, so image_guidance_scale > 1
with `rollout.sampling_options.guidance_scale` <= 1 is refused.

What trains is what text-to-image trains (the generation expert, or its LoRA); the SigLIP tower
is a frozen module like the VAE, and `connector` / `vit_pos_embed` stay frozen in the network.
Exports copy the checkpoint's `vit_model.*` tensors through unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from omni_rl.models import Conditioning, register_adapter
from omni_rl.models.diffusion import EditingOptions, check_multiple
from omni_rl.models.loading import ModelFolderError

from adapters.bagel.adapter import ARCHITECTURE, BagelAdapter, BagelOptions, patchify
from adapters.bagel.checkpoint import VIT_CONFIG
from adapters.bagel.network import LATENT_PATCH, VAE_DOWNSAMPLE, SourceImage
from adapters.bagel.vision import load_tower, vit_patches

STAGE = "edit"
WHAT = f"{ARCHITECTURE} (model.stage={STAGE})"
# What a request's condition adds to the text's conditioning (module docstring).
IMAGE_KEYS = ("image_latents", "image_grid", "vit_features", "vit_positions")


@dataclass
class BagelEditOptions(BagelOptions, EditingOptions):
    """BAGEL's options, and the source image's size."""

    def check(self) -> None:
        BagelOptions.check(self)
        EditingOptions.check(self)


@register_adapter(ARCHITECTURE, stage=STAGE)
class BagelEditAdapter(BagelAdapter):
    takes_source_image = True
    options_class = BagelEditOptions

    def load(self, folder: Path) -> None:
        """The text-to-image components and the frozen SigLIP tower."""
        super().load(folder)
        if not hasattr(self.network, "connector"):
            raise ModelFolderError(f"{folder / VIT_CONFIG} is missing: BAGEL edits through its SigLIP tower; "
                                   f"fetch the whole checkpoint (ByteDance-Seed/BAGEL-7B-MoT's layout)")
        self.vit = load_tower(folder, self.dtype, weights=not self.weightless)
        if not self.weightless:
            self.vit.to(self.device)
        side = self.network.vit_pos_embed.side
        if self.vit.max_patches_per_side != side:
            raise ModelFolderError(
                f"{folder / VIT_CONFIG}: image_size / patch_size gives {self.vit.max_patches_per_side} patches a side, "
                f"but vit_pos_embed has {side} (config.json's vit_max_num_patch_per_side); the position ids index both"
            )

    @classmethod
    def check_prompt_items(cls, items, where: str, adapter: str) -> None:
        super().check_prompt_items(items, where, f"{adapter} model.stage={STAGE}")  # the stage tells the two apart

    @classmethod
    def check_config(cls, cfg) -> None:
        """Text-to-image's checks, image CFG's (module docstring) and `model.adapter_options.condition_image_size`."""
        super().check_config(cfg)
        for i, value in enumerate(cfg.model.adapter_options.condition_image_size or ()):
            check_multiple(f"model.adapter_options.condition_image_size[{i}]", value, cls.size_multiple, f"what {WHAT} takes")

    @classmethod
    def check_image_guidance(cls, cfg) -> None:
        scale = cfg.model.adapter_options.image_guidance_scale
        if not (math.isfinite(scale) and scale >= 1.0):
            raise ValueError(f"model.adapter_options.image_guidance_scale={scale}: expected a number >= 1 (1 = no image CFG; "
                             f"BAGEL's editing uses 1.5 to 2)")
        if scale > 1.0 and cfg.rollout.sampling_options.guidance_scale <= 1.0:
            raise ValueError(
                f"model.adapter_options.image_guidance_scale={scale} with rollout.sampling_options.guidance_scale={cfg.rollout.sampling_options.guidance_scale}: BAGEL "
                f"applies image CFG only together with text CFG; set rollout.sampling_options.guidance_scale > 1 (BAGEL: 4), or "
                f"model.adapter_options.image_guidance_scale=1"
            )

    def frozen_modules(self) -> list[nn.Module]:
        return [self.vae, self.vit]

    # --- the source image ----------------------------------------------------------------
    def condition_size(self, height: int, width: int) -> tuple[int, int]:
        """[height, width] in px the source image is encoded at (module docstring)."""
        size = self.options.condition_image_size
        h, w = (height, width) if size is None else (int(size[0]), int(size[1]))
        self.check_side("model.adapter_options.condition_image_size[0]" if size else "rollout.sampling_options.height", h)
        self.check_side("model.adapter_options.condition_image_size[1]" if size else "rollout.sampling_options.width", w)
        return h, w

    def condition_images(self, images, height: int, width: int):
        """The prompt's one source image at `condition_size`, bicubic, as uint8 [H, W, 3]."""
        from PIL import Image

        if not images:
            raise ValueError(f"{WHAT} edits a source image: the prompt has none")
        if len(images) != 1:
            raise ValueError(f"{WHAT} takes one source image per prompt, got {len(images)}")
        h, w = self.condition_size(height, width)
        image = images[0].convert("RGB").resize((w, h), Image.BICUBIC)
        return (torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()),)

    @torch.no_grad()
    def encode_source(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Condition images uint8 [B, H, W, 3] (one size) -> the tensors of `IMAGE_KEYS`."""
        b, height, width, _ = images.shape
        pixels = (images.permute(0, 3, 1, 2).float() / 255.0 - 0.5) / 0.5  # the official vae_transform
        z = self.vae.encode(pixels.to(self.device, self.vae.dtype)).latent_dist.mean
        config = self.vae.config
        latents = (config.scaling_factor * (z - config.shift_factor)).float()
        grid = (height // (VAE_DOWNSAMPLE * LATENT_PATCH), width // (VAE_DOWNSAMPLE * LATENT_PATCH))
        patches, positions = zip(*(vit_patches(im, self.vit.patch_size, self.vit.max_patches_per_side) for im in images))
        patches, positions = torch.stack(patches).to(self.device), torch.stack(positions).to(self.device)
        features = self.vit(patches, positions).float()
        return {"image_latents": patchify(latents), "image_grid": torch.tensor([grid] * b, device=self.device),
                "vit_features": features, "vit_positions": positions}

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "", images=None) -> Conditioning:
        """Text-to-image's token ids (the instruction's and the negative prompt's) plus each
        prompt's source image (`images[i]`: its condition images, one uint8 [H, W, 3] tensor),
        both encodings (module docstring)."""
        if images is None or len(images) != len(prompts):
            got = "none" if images is None else len(images)
            raise ValueError(f"{WHAT} needs a source image for every prompt: {len(prompts)} prompts, {got} image groups")
        pictures = []
        for i, group in enumerate(images):
            if not group or len(group) != 1:
                raise ValueError(f"prompt {i} ({prompts[i]!r}): expected one condition image, got {len(group or ())}")
            image = group[0]
            if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[-1] != 3:
                raise ValueError(f"prompt {i}: a condition image is a uint8 [H, W, 3] tensor, got {image.dtype} "
                                 f"{tuple(image.shape)}")
            pictures.append(image)
        sizes = sorted({tuple(p.shape[:2]) for p in pictures})
        if len(sizes) != 1:
            raise ValueError(f"the prompts of one call must have source images of one size, got {sizes} ([H, W])")
        text = super().encode_prompts(prompts, negative_prompt)
        return Conditioning({**text.tensors, **self.encode_source(torch.stack(pictures))}, dict(text.masks))

    # --- forward (BagelAdapter.predict_velocity's hooks) ----------------------------------------
    def image_cfg_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return rows if self.options.image_guidance_scale > 1.0 else rows[:0]

    def image_cfg_scale(self) -> float:
        return self.options.image_guidance_scale

    def source_image(self, cond: Conditioning, branch: torch.Tensor, present: torch.Tensor) -> SourceImage:
        missing = [k for k in IMAGE_KEYS if k not in cond.tensors]
        if missing:
            raise ValueError(f"{WHAT}: the conditioning has no {missing}; encode the prompts with their source images "
                             f"(encode_prompts(..., images=))")
        grids = {tuple(g) for g in cond["image_grid"].tolist()}
        if len(grids) != 1:
            raise ValueError(f"one forward takes source images of one size, got token grids {sorted(grids)}")
        return SourceImage(cond["image_latents"][branch], grids.pop(), cond["vit_features"][branch],
                           cond["vit_positions"][branch], present)

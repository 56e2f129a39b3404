"""Qwen-Image-Edit instruction-based image editing (`QwenImageEditPipeline`, and Edit-Plus, the
2509 / 2511 checkpoints' `QwenImageEditPlusPipeline`): the adapters.

The same components and conventions as Qwen-Image (adapters/qwen_image.py: latents, sigma as the
timestep, the dynamic-shift schedule, true CFG with norm, 2x2 packing, the prefix count from the
loaded tokenizer), plus the source image, which enters twice as the pipeline feeds it:

- **through Qwen2.5-VL**: the prompt template has an image slot before the instruction; the
  processor expands it into the image's vision tokens, so the prompt embeddings (positive and
  negative, each with the sample's own image) have seen the image. The template's prefix up to
  the image slot is dropped (the pipeline's fixed 64 is the real tokenizer's count; the adapter
  counts it with the loaded one), the vision tokens are kept;
- **through the VAE**: the image's latent (the distribution's mode, normalised as the noise
  latents are) is packed into tokens and concatenated after the noise tokens along the
  sequence; the transformer sees both (`img_shapes` lists both grids) and only the noise
  tokens' output is the velocity.

Both encodings happen once per (instruction, negative prompt, image), at admission, and travel
in the sample's `Conditioning` (`image_latents` [B, S_img, C*4] and `image_grid` [B, 2], the
condition's token grid), so training replays exactly what the rollout saw.

**The condition's size.** The pipeline's own `__call__` resizes every source image to about one
megapixel (its `calculate_dimensions(1024 * 1024, aspect)`) whatever the output size: on a 512 px
recipe that is 4096 condition tokens against 1024 noise tokens. Here the source image is resized
to `model.adapter_options.condition_image_size` ([height, width], default the output's size) by the pipeline's
own image processor (Lanczos), and encoded at that size. Given a source image already at one
megapixel's calculated size, the pipeline and the adapter encode the same thing (the tests pass
such an image to both).

Edit-Plus (`QwenImageEditPlusAdapter`) differs where its pipeline does: up to three source
images per prompt, each given to Qwen2.5-VL as "Picture k:" before the instruction at about
384 x 384 px (so the template's prefix ends at its `{}`), and their VAE tokens concatenated in
order; one prompt per text-encoder call. Its vision-tower image is resized from the condition
image, where the pipeline resizes the original: the two agree for a source given at the
condition size (the tests do) and differ by a second resampling otherwise.

Its tiny models are in `adapters/tiny/qwen_image_edit.py`,
its view for the planner in `adapters/plan/qwen_image_edit.py`.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from omni_rl.models import Conditioning, register_adapter
from omni_rl.models.diffusion import EditingOptions, check_multiple

from adapters.qwen_image import QwenImageAdapter, pack_latents, prompt_prefix_length, true_cfg_with_norm, unpack_latents

_MASKS = {"prompt_embeds": "prompt_embeds_mask", "negative_prompt_embeds": "negative_prompt_embeds_mask"}
# Where the template's user content begins: the image slot (the prefix before it is dropped).
IMAGE_SLOT = "<|vision_start|>"


@register_adapter("QwenImageEditPipeline")
class QwenImageEditAdapter(QwenImageAdapter):
    takes_source_image = True
    options_class = EditingOptions
    pipeline_name: ClassVar[str] = "QwenImageEditPipeline"
    # Source images a prompt may have (Edit: one; EditPlus: up to three).
    max_source_images: ClassVar[int] = 1

    @classmethod
    def check_config(cls, cfg) -> None:
        """The output size (as Qwen-Image) and `model.adapter_options.condition_image_size`: multiples of 16."""
        super().check_config(cfg)
        size = cfg.model.adapter_options.condition_image_size
        if size is not None:
            for i, value in enumerate(size):
                check_multiple(f"model.adapter_options.condition_image_size[{i}]", value, cls.size_multiple, f"what {cls.pipeline_name} takes")

    def _pipeline_class(self):
        from diffusers import QwenImageEditPipeline

        return QwenImageEditPipeline

    def _build_pipeline(self, path: str, components: dict) -> None:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(path, subfolder="processor")
        self.pipeline = self._pipeline_class()(**components, processor=processor)
        self.prompt_prefix_length = self._prefix_length(self.pipeline.prompt_template_encode)

    def _prefix_length(self, template: str) -> int:
        """Edit's template holds the image slot before the instruction: the prefix ends there."""
        if template.count(IMAGE_SLOT) != 1:
            raise ValueError(f"the edit pipeline's prompt template has no single image slot {IMAGE_SLOT!r}: {template!r}")
        return prompt_prefix_length(self.pipeline.tokenizer, template, slot=IMAGE_SLOT)

    # --- the source image ----------------------------------------------------------------
    def condition_size(self, height: int, width: int) -> tuple[int, int]:
        """[height, width] in px the source image is encoded at (`model.adapter_options.condition_image_size`,
        else the output's size); a multiple of 16 on both sides."""
        size = self.options.condition_image_size
        h, w = (height, width) if size is None else (int(size[0]), int(size[1]))
        factor = self.vae_scale * self.patch
        why = f"VAE factor {self.vae_scale} x patch size {self.patch}"
        check_multiple("model.adapter_options.condition_image_size[0]" if size else "rollout.sampling_options.height", h, factor, why)
        check_multiple("model.adapter_options.condition_image_size[1]" if size else "rollout.sampling_options.width", w, factor, why)
        return h, w

    def condition_images(self, images, height: int, width: int):
        """The prompt's source images, each resized by the pipeline's image processor to
        `condition_size`, as uint8 [H, W, 3]."""
        if not images:
            raise ValueError(f"{self.pipeline_name} edits a source image: the prompt has none")
        if len(images) > self.max_source_images:
            raise ValueError(f"{self.pipeline_name} takes at most {self.max_source_images} source image(s) per prompt, "
                             f"got {len(images)}")
        h, w = self.condition_size(height, width)
        return tuple(torch.from_numpy(np.asarray(self.pipeline.image_processor.resize(im.convert("RGB"), h, w),
                                                 dtype=np.uint8).copy()) for im in images)

    @staticmethod
    def _pil(image: torch.Tensor):
        from PIL import Image

        if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"a condition image is a uint8 [H, W, 3] tensor, got {image.dtype} {tuple(image.shape)}")
        return Image.fromarray(image.cpu().numpy())

    @torch.no_grad()
    def encode_image_latents(self, images: list) -> torch.Tensor:
        """Source images (PIL, all one size) -> packed normalised VAE latents [B, S_img, C*4]
        (the distribution's mode, as the pipeline encodes a condition image)."""
        w, h = images[0].size
        pixels = self.pipeline.image_processor.preprocess(images, h, w).unsqueeze(2)
        z = self.vae.encode(pixels.to(self.device, self.vae.dtype)).latent_dist.mode()
        config = self.vae.config
        shape = (1, config.z_dim, 1, 1, 1)
        mean = torch.tensor(config.latents_mean, device=z.device, dtype=z.dtype).view(shape)
        std = torch.tensor(config.latents_std, device=z.device, dtype=z.dtype).view(shape)
        return pack_latents(((z - mean) / std).to(torch.float32), self.patch)

    # --- conditioning --------------------------------------------------------------------
    def _encode_text(self, texts: list[str], groups: list[list]) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings [B, L, D] and mask of `texts[i]` with its source images `groups[i]` (PIL),
        in one batched call of the pipeline's `encode_prompt` (one image per prompt)."""
        embeds, mask = self.pipeline.encode_prompt(prompt=texts, image=[g[0] for g in groups], device=self.device)
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        return embeds, mask.to(torch.long)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "", images=None) -> Conditioning:
        """Each instruction's embeddings with its source images (`images[i]`: the request's
        condition images, uint8 tensors), the negative prompt's with the same images, and the
        images' packed latents, concatenated in order; see the module docstring."""
        if images is None or len(images) != len(prompts):
            got = "none" if images is None else len(images)
            raise ValueError(f"{self.pipeline_name} needs source images for every prompt: {len(prompts)} prompts, "
                             f"{got} image groups")
        groups = []
        for i, group in enumerate(images):
            if not group or len(group) > self.max_source_images:
                raise ValueError(f"prompt {i} ({prompts[i]!r}): expected 1 to {self.max_source_images} condition "
                                 f"image(s), got {0 if not group else len(group)}")
            groups.append([self._pil(im) for im in group])
        layouts = {tuple(im.size for im in g) for g in groups}
        if len(layouts) != 1:
            raise ValueError(f"the prompts of one call must have source images of one layout, got {sorted(layouts)} "
                             f"((width, height) per image)")
        tensors = {}
        for name, texts in (("prompt_embeds", list(prompts)), ("negative_prompt_embeds", [negative_prompt] * len(prompts))):
            tensors[name], tensors[_MASKS[name]] = self._encode_text(texts, groups)
        factor = self.vae_scale * self.patch
        tensors["image_latents"] = torch.cat(
            [self.encode_image_latents([g[k] for g in groups]) for k in range(len(groups[0]))], dim=1
        )
        grid = [v for im in groups[0] for v in (im.size[1] // factor, im.size[0] // factor)]
        tensors["image_grid"] = torch.tensor([grid] * len(prompts), dtype=torch.long)
        return Conditioning(tensors, dict(_MASKS))

    # --- forward -------------------------------------------------------------------------
    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        """Velocity (fp32, [B, C, 1, h, w]) of the noise tokens, the source images' tokens
        concatenated after them, with true CFG with norm when `guidance_scale` > 1."""
        b, _, _, h, w = latents.shape
        sigma = sigma.to(torch.float32).reshape(-1).to(self.device)
        if sigma.shape[0] != b:
            raise ValueError(f"sigma has {sigma.shape[0]} values for a batch of {b} latents")
        cond = conditioning.to(self.device)
        grids = {tuple(g) for g in cond["image_grid"].tolist()}
        if len(grids) != 1:
            raise ValueError(f"one forward takes source images of one layout, got token grids {sorted(grids)}")
        (grid,) = grids
        x = pack_latents(latents.to(self.device, torch.float32), self.patch)
        tokens = x.shape[1]
        x = torch.cat([x, cond["image_latents"].to(torch.float32)], dim=1).to(self.dtype)
        guided = guidance_scale > 1.0
        parts = ("negative_prompt_embeds", "prompt_embeds") if guided else ("prompt_embeds",)
        text = Conditioning.cat([
            Conditioning({"e": cond[name], "m": cond[_MASKS[name]]}, {"e": "m"}) for name in parts
        ])
        copies = len(parts)
        shapes = [(1, h // self.patch, w // self.patch), *[(1, grid[k], grid[k + 1]) for k in range(0, len(grid), 2)]]
        out = self.transformer(
            hidden_states=torch.cat([x] * copies),
            timestep=torch.cat([sigma] * copies).to(self.dtype),
            encoder_hidden_states=text["e"].to(self.dtype),
            encoder_hidden_states_mask=text["m"],
            img_shapes=[shapes] * (b * copies),
            return_dict=False,
        )[0][:, :tokens].to(torch.float32)
        if guided:
            uncond, cond_v = out.chunk(2)
            out = true_cfg_with_norm(cond_v, uncond, guidance_scale)
        return unpack_latents(out, h, w, self.patch)

    # --- saving --------------------------------------------------------------------------
    def save_lora(self, folder: str) -> None:
        """diffusers' LoRA format with its adapter metadata: the pipeline's `load_lora_weights(folder)`."""
        from peft.utils import get_peft_model_state_dict

        self._pipeline_class().save_lora_weights(
            folder, transformer_lora_layers=get_peft_model_state_dict(self.transformer),
            transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
        )


@register_adapter("QwenImageEditPlusPipeline")
class QwenImageEditPlusAdapter(QwenImageEditAdapter):
    """Qwen-Image-Edit-2509 / 2511 (`QwenImageEditPlusPipeline`): up to three source images. Each
    enters Qwen2.5-VL as "Picture k: <image>" before the instruction, at about 384 x 384 px (the
    pipeline's area, kept here: it sets the vision-token count), resized from the condition image;
    its VAE tokens (at `condition_size`) follow the noise tokens in order. The pipeline encodes one
    prompt per call (it refuses batches); so does this adapter, and embeddings of different
    lengths are padded under their masks."""

    pipeline_name: ClassVar[str] = "QwenImageEditPlusPipeline"
    max_source_images: ClassVar[int] = 3

    def _pipeline_class(self):
        from diffusers import QwenImageEditPlusPipeline

        return QwenImageEditPlusPipeline

    def _prefix_length(self, template: str) -> int:
        return prompt_prefix_length(self.pipeline.tokenizer, template)  # the pictures follow the prefix

    def _encode_text(self, texts: list[str], groups: list[list]) -> tuple[torch.Tensor, torch.Tensor]:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import CONDITION_IMAGE_SIZE, calculate_dimensions

        parts = []
        for text, group in zip(texts, groups):
            vision = []
            for im in group:
                w, h = calculate_dimensions(CONDITION_IMAGE_SIZE, im.size[0] / im.size[1])[:2]
                vision.append(self.pipeline.image_processor.resize(im, h, w))
            embeds, mask = self.pipeline.encode_prompt(prompt=[text], image=vision, device=self.device)
            if mask is None:
                mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
            parts.append(Conditioning({"e": embeds, "m": mask.to(torch.long)}, {"e": "m"}))
        joined = Conditioning.cat(parts)
        return joined["e"], joined["m"]

"""Qwen-Image-Edit instruction-based image editing (`QwenImageEditPipeline`): the adapter and its tiny model.

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
to `model.condition_image_size` ([height, width], default the output's size) by the pipeline's
own image processor (Lanczos), and encoded at that size. Given a source image already at one
megapixel's calculated size, the pipeline and the adapter encode the same thing (the tests pass
such an image to both).

`tiny:qwen_image_edit` is `tiny:qwen_image` plus the Qwen2-VL processor (image patches of 14 px,
merged 2x2) that the edit pipeline loads.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, register_adapter, register_tiny_model
from omni_rl.models.diffusion import check_multiple

from adapters.qwen_image import (
    QwenImageAdapter, build_tiny_qwen_image_components, pack_latents, prompt_prefix_length, true_cfg_with_norm,
    unpack_latents,
)

_MASKS = {"prompt_embeds": "prompt_embeds_mask", "negative_prompt_embeds": "negative_prompt_embeds_mask"}
# Where the template's user content begins: the image slot (the prefix before it is dropped).
IMAGE_SLOT = "<|vision_start|>"


@register_adapter("QwenImageEditPipeline")
class QwenImageEditAdapter(QwenImageAdapter):
    takes_source_image = True

    @classmethod
    def check_config(cls, cfg) -> None:
        """The output size (as Qwen-Image) and `model.condition_image_size`: multiples of 16."""
        super().check_config(cfg)
        size = cfg.model.condition_image_size
        if size is not None:
            for i, value in enumerate(size):
                check_multiple(f"model.condition_image_size[{i}]", value, cls.size_multiple, "what QwenImageEditPipeline takes")

    def _build_pipeline(self, path: str, components: dict) -> None:
        from diffusers import QwenImageEditPipeline
        from transformers import AutoProcessor

        self.pipeline = QwenImageEditPipeline(**components, processor=AutoProcessor.from_pretrained(path, subfolder="processor"))
        template = self.pipeline.prompt_template_encode
        if template.count(IMAGE_SLOT) != 1:
            raise ValueError(f"the edit pipeline's prompt template has no single image slot {IMAGE_SLOT!r}: {template!r}")
        self.prompt_prefix_length = prompt_prefix_length(self.pipeline.tokenizer, template, slot=IMAGE_SLOT)

    # --- the source image ----------------------------------------------------------------
    def condition_size(self, height: int, width: int) -> tuple[int, int]:
        """[height, width] in px the source image is encoded at (`model.condition_image_size`,
        else the output's size); a multiple of 16 on both sides."""
        size = self.cfg.condition_image_size
        h, w = (height, width) if size is None else (int(size[0]), int(size[1]))
        factor = self.vae_scale * self.patch
        why = f"VAE factor {self.vae_scale} x patch size {self.patch}"
        check_multiple("model.condition_image_size[0]" if size else "rollout.height", h, factor, why)
        check_multiple("model.condition_image_size[1]" if size else "rollout.width", w, factor, why)
        return h, w

    def condition_images(self, images, height: int, width: int):
        """The prompt's one source image, resized by the pipeline's image processor to
        `condition_size`, as uint8 [H, W, 3]."""
        if not images:
            raise ValueError("QwenImageEditPipeline edits a source image: the prompt has none")
        if len(images) != 1:
            raise ValueError(f"QwenImageEditPipeline edits one source image per prompt, got {len(images)}")
        h, w = self.condition_size(height, width)
        resized = self.pipeline.image_processor.resize(images[0].convert("RGB"), h, w)
        return (torch.from_numpy(np.asarray(resized, dtype=np.uint8).copy()),)

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
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "", images=None) -> Conditioning:
        """Each instruction's embeddings with its source image (`images[i]`: the request's
        condition images, one uint8 tensor), the negative prompt's with the same image, and the
        image's packed latents; see the module docstring."""
        if images is None or len(images) != len(prompts):
            got = "none" if images is None else len(images)
            raise ValueError(f"QwenImageEditPipeline needs one source image per prompt: {len(prompts)} prompts, {got} images")
        pil = []
        for i, group in enumerate(images):
            if group is None or len(group) != 1:
                raise ValueError(f"prompt {i} ({prompts[i]!r}): expected one condition image, got {group!r}")
            pil.append(self._pil(group[0]))
        sizes = {im.size for im in pil}
        if len(sizes) != 1:
            raise ValueError(f"condition images of one call must share a size, got {sorted(sizes)} (width, height)")
        tensors = {}
        for name, texts in (("prompt_embeds", list(prompts)), ("negative_prompt_embeds", [negative_prompt] * len(prompts))):
            embeds, mask = self.pipeline.encode_prompt(prompt=texts, image=pil, device=self.device)
            if mask is None:  # the pipeline drops an all-ones mask
                mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
            tensors[name], tensors[_MASKS[name]] = embeds, mask.to(torch.long)
        tensors["image_latents"] = self.encode_image_latents(pil)
        w, h = pil[0].size
        factor = self.vae_scale * self.patch
        tensors["image_grid"] = torch.tensor([[h // factor, w // factor]] * len(prompts), dtype=torch.long)
        return Conditioning(tensors, dict(_MASKS))

    # --- forward -------------------------------------------------------------------------
    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        """Velocity (fp32, [B, C, 1, h, w]) of the noise tokens, the condition image's tokens
        concatenated after them, with true CFG with norm when `guidance_scale` > 1."""
        b, _, _, h, w = latents.shape
        sigma = sigma.to(torch.float32).reshape(-1).to(self.device)
        if sigma.shape[0] != b:
            raise ValueError(f"sigma has {sigma.shape[0]} values for a batch of {b} latents")
        cond = conditioning.to(self.device)
        grids = {tuple(g) for g in cond["image_grid"].tolist()}
        if len(grids) != 1:
            raise ValueError(f"one forward takes condition images of one size, got token grids {sorted(grids)}")
        (gh, gw), = grids
        x = pack_latents(latents.to(self.device, torch.float32), self.patch)
        tokens = x.shape[1]
        x = torch.cat([x, cond["image_latents"].to(torch.float32)], dim=1).to(self.dtype)
        guided = guidance_scale > 1.0
        parts = ("negative_prompt_embeds", "prompt_embeds") if guided else ("prompt_embeds",)
        text = Conditioning.cat([
            Conditioning({"e": cond[name], "m": cond[_MASKS[name]]}, {"e": "m"}) for name in parts
        ])
        copies = len(parts)
        shapes = [(1, h // self.patch, w // self.patch), (1, gh, gw)]
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
        """diffusers' LoRA format with its adapter metadata: `QwenImageEditPipeline.load_lora_weights(folder)`."""
        from diffusers import QwenImageEditPipeline
        from peft.utils import get_peft_model_state_dict

        QwenImageEditPipeline.save_lora_weights(
            folder, transformer_lora_layers=get_peft_model_state_dict(self.transformer),
            transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
        )


# --- the tiny model -----------------------------------------------------------------------
def tiny_processor(tokenizer):
    """Qwen2-VL's processor on the tiny tokenizer: 14 px patches, merged 2x2 (the tiny vision
    tower's), the image processor's default pixel bounds (the processor requires a video
    processor too, which the edit pipeline never calls)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    return Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(patch_size=14, merge_size=2), tokenizer=tokenizer,
                            video_processor=Qwen2VLVideoProcessor(patch_size=14, merge_size=2))


@register_tiny_model("qwen_image_edit")
def build_tiny_qwen_image_edit(folder: Path) -> None:
    """`tiny:qwen_image`'s seeded components (the same weights) and the processor, saved as a
    `QwenImageEditPipeline`."""
    from diffusers import QwenImageEditPipeline

    components = build_tiny_qwen_image_components()
    QwenImageEditPipeline(**components, processor=tiny_processor(components["tokenizer"])).save_pretrained(Path(folder))

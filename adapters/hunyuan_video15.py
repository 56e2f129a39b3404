"""HunyuanVideo-1.5 text-to-video (`HunyuanVideo15Pipeline`): the adapter.

Loads the pipeline's components with diffusers' and transformers' `from_pretrained` (through
`self.load_pretrained`): the `HunyuanVideo15Transformer3DModel` (trained, LoRA on the attention
projections), the `AutoencoderKLHunyuanVideo15` VAE (16x spatial, 4x temporal compression) and
two frozen text encoders: Qwen2.5-VL's language model (`Qwen2_5_VLTextModel`) on the pipeline's
chat template, and the glyph ByT5 encoder (`T5EncoderModel`) on the quoted text of a prompt.
Text-to-video needs no image encoder: the pipeline feeds the transformer all-zero image
embeddings, which the transformer masks out.

The conventions, the same at rollout and in training because both go through this one file:

- **latents**: the pipeline's, [C, (F - 1) / 4 + 1, H / 16, W / 16] (a standard-normal draw is
  its initial noise); `predict_velocity` appends the t2v condition channels as the pipeline
  does (C zero condition-latent channels and a zero mask channel: 2C + 1 transformer inputs);
- **timestep**: sigma x num_train_timesteps, as the pipeline passes the scheduler's timesteps;
- **schedule**: the pipeline's `linspace(1, 0, N + 1)[:-1]` sigmas, shifted by the Euler
  scheduler's fixed `shift` (the checkpoint's: 5.0 at 480p, 9.0 at 720p t2v);
  `model.adapter_options.shift` overrides it. There is no dynamic (length-dependent) shift in 1.5's pipeline;
- **guidance**: the pipeline's guider is diffusers' `ClassifierFreeGuidance`:
  `uncond + g (cond - uncond)` with g = `rollout.sampling_options.guidance_scale` (the checkpoint's guider says
  6.0 for the 480p/720p t2v models, 1.0 for the CFG-distilled ones). The unconditional branch
  encodes `rollout.sampling_options.negative_prompt` (the pipeline's default: the empty prompt). A guider with
  rescale, the original formulation or a start/stop window is refused at load;
- **text**: both encoders through the pipeline's own `encode_prompt`. The pipeline drops a
  fixed 108 tokens of template prefix, right for the real tokenizer only; the adapter counts
  the prefix with the loaded tokenizer (as the Qwen-Image adapter does). The pipeline pads the
  Qwen text to `tokenizer_max_length` (1000) and the glyph text to 256 tokens; the transformer
  gathers the valid tokens of each sample first and masks the rest, so the adapter keeps only
  up to the longest valid token in the batch, in a `Conditioning` with masks (padding inert);
  likewise it passes no image tokens (the pipeline's 729 all-zero ones are all masked);
- **decode**: latents / `scaling_factor` through the VAE, to uint8 [B, T, H, W, 3].

Frames must be 4k+1 and sizes multiples of 16 (VAE factor x patch size); another raises a
one-line error naming the nearest valid values (at config load for the class's factors, and
from the loaded checkpoint's configs in `latent_shape`).

LoRA export: diffusers 0.42's `HunyuanVideo15Pipeline` has no LoRA loader mixin (no
`load_lora_weights`), so the export is diffusers' LoRA file format (`transformer.`-prefixed
keys, the adapter config in its metadata), loaded with the transformer's own PEFT loader:
`pipe.transformer.load_lora_adapter(folder, prefix="transformer")`.

Its tiny models are in `adapters/tiny/hunyuan_video15.py`,
its view for the planner in `adapters/plan/hunyuan_video15.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from omni_rl.option import option
from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter
from omni_rl.models.diffusion import PromptLengthOptions

from adapters.qwen_image import prompt_prefix_length

# (embedding, its mask) of each text stream, positive and negative.
_MASKS = {
    "prompt_embeds": "prompt_embeds_mask", "prompt_embeds_2": "prompt_embeds_mask_2",
    "negative_prompt_embeds": "negative_prompt_embeds_mask", "negative_prompt_embeds_2": "negative_prompt_embeds_mask_2",
}
# The guider settings the adapter implements (diffusers' ClassifierFreeGuidance defaults).
_PLAIN_CFG = {"guidance_rescale": 0.0, "use_original_formulation": False, "start": 0.0, "stop": 1.0}
LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"


@dataclass
class HunyuanVideo15Options(PromptLengthOptions):
    """HunyuanVideo-1.5's options (`model.adapter_options`)."""

    max_sequence_length: int = option(1000, "Qwen2.5-VL prompt tokens after the template (the pipeline's tokenizer_max_length, 1000): longer prompts are cut.")
    glyph_max_sequence_length: int = option(256, "ByT5 tokens of the prompt's quoted (glyph) text (the pipeline's tokenizer_2_max_length, 256).")
    shift: Optional[float] = option(None, "Flow shift of the Euler schedule; null = the checkpoint's scheduler shift (480p t2v 5.0, 720p t2v 9.0). Rollout and training use the same.")

    def check(self) -> None:
        super().check()
        if not (isinstance(self.glyph_max_sequence_length, int) and self.glyph_max_sequence_length >= 1):
            raise ValueError(f"glyph_max_sequence_length={self.glyph_max_sequence_length!r}: expected an integer >= 1")
        if self.shift is not None and not (math.isfinite(self.shift) and self.shift > 0):
            raise ValueError(f"shift={self.shift!r}: expected a finite flow shift > 0, or null for the checkpoint's")


def _nearest(value: int, multiple: int) -> str:
    low = max(multiple, value // multiple * multiple)
    return f"{low} and {low + multiple}" if low < value else f"{low}"


@register_adapter("HunyuanVideo15Pipeline")
class HunyuanVideo15Adapter(DiffusionModelBase):
    options_class = HunyuanVideo15Options
    # The VAE keeps the first frame and compresses every 4 after it; 16 px per latent, patch 1
    # (every released checkpoint; `latent_shape` checks the loaded one's configs).
    frame_stride = 4
    size_multiple = 16
    # Attention projections of every block: video stream (to_*) and text stream (add_*_proj,
    # to_add_out), and the token refiner's self-attention (PEFT matches name suffixes).
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        from diffusers import (
            AutoencoderKLHunyuanVideo15, ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler,
            HunyuanVideo15Pipeline, HunyuanVideo15Transformer3DModel,
        )
        from transformers import AutoTokenizer, Qwen2_5_VLTextModel, T5EncoderModel

        super().__init__(cfg, path, device)

        def load(cls, sub):
            return self.load_pretrained(cls, sub).to(device)

        self.transformer = load(HunyuanVideo15Transformer3DModel, "transformer")
        self.vae = load(AutoencoderKLHunyuanVideo15, "vae")
        # diffusers 0.42's VAE attention broadcasts its causal mask wrongly for a batch > 1:
        # decode one video at a time (diffusers' own slicing).
        self.vae.enable_slicing()
        self.text_encoder = load(Qwen2_5_VLTextModel, "text_encoder")
        self.text_encoder_2 = load(T5EncoderModel, "text_encoder_2")
        scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler")
        if scheduler.config.get("use_dynamic_shifting", False):
            raise ValueError(f"{Path(path) / 'scheduler'}: use_dynamic_shifting is set, but HunyuanVideo15Pipeline "
                             f"passes no mu; expected a fixed `shift`")
        shift = self.options.shift
        self.scheduler = scheduler if shift is None else FlowMatchEulerDiscreteScheduler.from_config(
            scheduler.config, shift=float(shift))
        guider = ClassifierFreeGuidance.from_pretrained(path, subfolder="guider")
        unsupported = {k: guider.config.get(k) for k, v in _PLAIN_CFG.items() if guider.config.get(k, v) != v}
        if unsupported:
            raise ValueError(f"{Path(path) / 'guider'}: {unsupported} is not plain CFG; the adapter applies "
                             f"uncond + g (cond - uncond) over every step (expected {_PLAIN_CFG})")
        self.pipeline = HunyuanVideo15Pipeline(
            text_encoder=self.text_encoder, tokenizer=AutoTokenizer.from_pretrained(path, subfolder="tokenizer"),
            transformer=self.transformer, vae=self.vae, scheduler=self.scheduler, text_encoder_2=self.text_encoder_2,
            tokenizer_2=AutoTokenizer.from_pretrained(path, subfolder="tokenizer_2"), guider=guider,
        )
        self.pipeline.set_progress_bar_config(disable=True)
        # The pipeline reads these instance attributes when it encodes (module docstring).
        self.pipeline.prompt_template_encode_start_idx = self.prompt_prefix_length(self.pipeline)
        self.pipeline.tokenizer_max_length = self.options.max_sequence_length
        self.pipeline.tokenizer_2_max_length = self.options.glyph_max_sequence_length
        self.num_train_timesteps = self.scheduler.config.num_train_timesteps
        self.setup_trainable()

    @staticmethod
    def prompt_prefix_length(pipeline) -> int:
        """Tokens of the chat template before the prompt (system turn and the user turn's
        opening), counted with the pipeline's tokenizer: what `encode_prompt` drops."""
        conversation = [{"role": "system", "content": pipeline.system_message}, {"role": "user", "content": "{}"}]
        template = pipeline.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return prompt_prefix_length(pipeline.tokenizer, template)

    # --- what trains ---------------------------------------------------------------------
    def trainable_module(self) -> nn.Module:
        return self.transformer

    def frozen_modules(self) -> list[nn.Module]:
        return [self.vae, self.text_encoder, self.text_encoder_2]

    def fsdp_wrap_classes(self):
        from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15TransformerBlock

        return (HunyuanVideo15TransformerBlock,)

    # --- shapes and schedule -------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int = 1) -> tuple[int, ...]:
        """[latent_channels, (num_frames - 1) / t + 1, height / s, width / s] for the VAE's
        temporal and spatial factors t, s; frames t*k + 1, sizes multiples of s x patch size."""
        vae, c = self.vae.config, self.transformer.config
        return hunyuan_latent_shape(vae, c.patch_size, c.patch_size_t, height, width, num_frames)

    @classmethod
    def config_latent_numel(cls, cfg, configs) -> int | None:
        vae, transformer = configs.get("vae"), configs.get("transformer")
        r = cfg.rollout.sampling_options
        try:
            shape = hunyuan_latent_shape(vae, int(transformer["patch_size"]), int(transformer["patch_size_t"]),
                                         r.height, r.width, r.num_frames)
        except (KeyError, TypeError, ValueError):  # no or odd configs: the built model's latent_shape says
            return None
        return math.prod(shape)

    def base_sigmas(self, num_steps: int) -> list[float]:
        """The pipeline's unshifted sigmas, `linspace(1, 0, N + 1)[:-1]`."""
        if num_steps < 1:
            raise ValueError(f"num_steps={num_steps}: expected at least 1 denoising step")
        return np.linspace(1.0, 0.0, num_steps + 1)[:-1].tolist()

    # --- conditioning --------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        """Both text streams of each prompt and of the negative prompt (one for every prompt),
        through the pipeline's `encode_prompt`, cut after the last valid token of the batch."""
        n = len(prompts)
        tensors = {}
        for prefix, texts in (("", list(prompts)), ("negative_", [negative_prompt])):
            embeds, mask, embeds_2, mask_2 = self.pipeline.encode_prompt(
                prompt=texts, device=self.device, dtype=self.text_encoder.dtype, batch_size=len(texts))
            for name, e, m in (("prompt_embeds", embeds, mask), ("prompt_embeds_2", embeds_2, mask_2)):
                e, m = _cut_padding(e, m.to(torch.long))
                if e.shape[0] != n:
                    e, m = e.expand(n, -1, -1).contiguous(), m.expand(n, -1).contiguous()
                tensors[prefix + name], tensors[_MASKS[prefix + name]] = e, m
        return Conditioning(tensors, dict(_MASKS))

    # --- forward -------------------------------------------------------------------------
    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        """Velocity (fp32, [B, C, F, h, w]) at per-sample sigma [B], with CFG when
        `guidance_scale` > 1: one forward over [uncond; cond] (module docstring)."""
        b = latents.shape[0]
        timestep = sigma.to(torch.float32).reshape(-1).to(self.device) * self.num_train_timesteps
        if timestep.shape[0] != b:
            raise ValueError(f"sigma has {timestep.shape[0]} values for a batch of {b} latents")
        x = latents.to(self.device, self.dtype)
        zeros = torch.zeros_like(x)
        # The pipeline's t2v input: [latents, condition latents (0), condition mask (0)].
        x = torch.cat([x, zeros, zeros[:, :1]], dim=1)
        cond = conditioning.to(self.device)
        guided = guidance_scale > 1.0
        prefixes = ("negative_", "") if guided else ("",)
        streams = {}
        for name in ("prompt_embeds", "prompt_embeds_2"):
            # Each stream's two texts have their own lengths: pad to the longer, masked out.
            text = Conditioning.cat([
                Conditioning({"e": cond[p + name], "m": cond[_MASKS[p + name]]}, {"e": "m"}) for p in prefixes
            ])
            streams[name] = (text["e"].to(self.dtype), text["m"].to(self.dtype))
        copies = len(prefixes)
        rows = b * copies
        out = self.transformer(
            hidden_states=torch.cat([x] * copies),
            timestep=torch.cat([timestep] * copies).to(self.dtype),
            encoder_hidden_states=streams["prompt_embeds"][0],
            encoder_attention_mask=streams["prompt_embeds"][1],
            encoder_hidden_states_2=streams["prompt_embeds_2"][0],
            encoder_attention_mask_2=streams["prompt_embeds_2"][1],
            image_embeds=torch.zeros(rows, 0, self.transformer.config.image_embed_dim, device=self.device, dtype=self.dtype),
            return_dict=False,
        )[0].to(torch.float32)
        if guided:
            uncond, text = out.chunk(2)
            return uncond + guidance_scale * (text - uncond)
        return out

    # --- decoding ------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [B, C, F, h, w] -> uint8 video [B, T, H, W, 3] (the pipeline's
        `latents / scaling_factor` through the VAE)."""
        z = latents.to(self.device, self.vae.dtype) / self.vae.config.scaling_factor
        video = self.vae.decode(z, return_dict=False)[0]
        video = (video.float() / 2 + 0.5).clamp(0, 1)
        return (video * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).cpu()

    # --- saving --------------------------------------------------------------------------
    def save_lora(self, folder: str) -> None:
        """diffusers' LoRA file (`transformer.`-prefixed keys, the adapter config in the file's
        metadata). diffusers 0.42's HunyuanVideo15Pipeline has no `load_lora_weights`; load it
        with the transformer's own loader:

            pipe.transformer.load_lora_adapter(folder, prefix="transformer")"""
        from diffusers.loaders.lora_base import LoraBaseMixin
        from peft.utils import get_peft_model_state_dict

        layers = LoraBaseMixin.pack_weights(get_peft_model_state_dict(self.transformer), "transformer")
        metadata = _flat_metadata({"transformer": self.transformer.peft_config["default"].to_dict()})
        LoraBaseMixin.write_lora_layers(
            state_dict=layers, save_directory=folder, is_main_process=True, weight_name=LORA_WEIGHT_NAME,
            save_function=None, safe_serialization=True, lora_adapter_metadata=metadata,
        )


def _flat_metadata(metadata: dict) -> dict:
    """diffusers' LoRA metadata layout: `<component>.<key>` -> value (what `save_lora_weights`
    of the pipelines with a LoRA mixin writes)."""
    return {f"{component}.{k}": v for component, config in metadata.items() for k, v in config.items()}


def _cut_padding(embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings [B, L, D] and mask [B, L] up to the batch's last valid token (at least one
    position): the rest is padding the transformer masks out."""
    valid = mask.bool().any(dim=0).nonzero()
    length = int(valid.max()) + 1 if valid.numel() else 1
    return embeds[:, :length], mask[:, :length]


def hunyuan_latent_shape(vae, patch: int, patch_t: int, height: int, width: int, num_frames: int) -> tuple[int, ...]:
    """The latent of an output of that geometry for a VAE config (mapping) and the transformer's
    patch sizes, or `ValueError` naming the nearest valid values."""
    t, s = int(vae["temporal_compression_ratio"]), int(vae["spatial_compression_ratio"])
    if num_frames < 1 or (num_frames - 1) % (t * patch_t):
        step = t * patch_t
        low = max(0, (num_frames - 1) // step) * step + 1
        raise ValueError(
            f"num_frames={num_frames} is not {step}k+1 (the VAE compresses {t} frames into one after the first); "
            f"the nearest valid frame counts are {low} and {low + step}"
        )
    multiple = s * patch
    for name, value in (("height", height), ("width", width)):
        if value <= 0 or value % multiple:
            raise ValueError(f"{name}={value} px is not a multiple of {multiple} (VAE factor {s} x patch size {patch}); "
                             f"the nearest valid values are {_nearest(value, multiple)}")
    return (int(vae["latent_channels"]), (num_frames - 1) // t + 1, height // s, width // s)

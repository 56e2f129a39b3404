"""FLUX.1 text-to-image (`FluxPipeline`: FLUX.1-dev): the adapter.

Loads the pipeline's components with diffusers' and transformers' `from_pretrained` (through
`self.load_pretrained`): the MMDiT `FluxTransformer2DModel` (trained, LoRA on the attention
projections of the double-stream and single-stream blocks), the 16-channel `AutoencoderKL`, the
CLIP text encoder (its pooled output) and T5 (its token embeddings).

The conventions, the same at rollout and in training because both go through this one file:

- **latents**: the engine carries each sample as the VAE's latent, normalised as the pipeline
  denoises it ((z - shift_factor) * scaling_factor), shape [16, H/8, W/8]; `predict_velocity`
  packs 2x2 latent pixels into the transformer's tokens [B, H/16 * W/16, 64] (the pipeline's
  `_pack_latents`, a permutation, so a standard-normal draw is the pipeline's initial noise) and
  unpacks its output;
- **position ids**: the pipeline's: `img_ids` [S, 3] = (0, row, column) of each packed token,
  `txt_ids` [L, 3] all zero (FLUX's RoPE reads them; they depend on the geometry only);
- **timestep**: sigma itself (the pipeline's `t / 1000`);
- **schedule**: the pipeline's `linspace(1, 1/N, N)` sigmas, shifted by the dynamic `mu` of the
  packed image token count (`calculate_shift` with the scheduler config's base/max sequence
  lengths and shifts);
- **guidance**: FLUX.1-dev is guidance-distilled. Its guidance is an embedding the transformer
  reads (`guidance`, the pipeline's `guidance_scale`, 3.5 by default): here
  `model.adapter_options.guidance`, the same for every sample; there is no second forward. True CFG (the
  pipeline's `true_cfg_scale`, as flow_grpo's and DanceGRPO's FLUX scripts can run it) is
  `rollout.sampling_options.guidance_scale`: above 1 *and* with a negative prompt (`rollout.sampling_options.negative_prompt`, not
  empty), the negative prompt's forward runs too (one batched call over [negative; prompt]) and
  `neg + s (cond - neg)` is the velocity. As in the pipeline, a scale above 1 without a negative
  prompt runs no CFG: the recipes' `rollout.sampling_options.guidance_scale: 1.0` says so explicitly. Whether a
  sample has a negative prompt travels in its `Conditioning` (`has_negative`), so a packed batch
  may mix both kinds and training replays each sample's own guidance;
- **prompt embeddings**: the pipeline's `encode_prompt`: T5's last hidden state, padded to
  `model.adapter_options.max_sequence_length` tokens (no mask: FLUX attends to T5's padding, as the
  pipeline does), and CLIP's pooled output.

`decode` un-normalises, runs the VAE and returns uint8 [B, H, W, 3]. Sizes must be multiples of
16 (VAE factor 8 x the 2x2 packing); another raises `ValueError` with the nearest valid values,
at config load too (`size_multiple`). An edit dataset is refused at load (`check_prompt_items`):
FLUX.1-Kontext (adapters/flux_kontext.py) edits images and builds on this adapter.

Its tiny models are in `adapters/tiny/flux.py`, its view for the planner in `adapters/plan/flux.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from omni_rl.option import option
from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter
from omni_rl.models.diffusion import PromptLengthOptions, check_image_only, check_multiple, linspace_to_one_over_n


# The pipeline refuses longer T5 prompts (its `check_inputs`).
MAX_TEXT_TOKENS = 512
# 2x2 latent pixels make one transformer token (the pipeline's packing).
PACK = 2


@dataclass
class FluxOptions(PromptLengthOptions):
    """FLUX.1's own knobs (`model.adapter_options`)."""

    max_sequence_length: int = option(512, "T5 prompt tokens (the pipeline's max_sequence_length, at most 512): prompts are padded or cut to it, and FLUX attends to all of them.")
    guidance: float = option(3.5, "The distilled guidance the transformer embeds (FluxPipeline's guidance_scale; flow_grpo and DanceGRPO call it guidance_scale too). Not CFG: rollout.sampling_options.guidance_scale is the pipeline's true_cfg_scale, which needs a rollout.sampling_options.negative_prompt.")

    def check(self) -> None:
        super().check()
        if self.max_sequence_length > MAX_TEXT_TOKENS:
            raise ValueError(f"max_sequence_length={self.max_sequence_length}: FLUX's T5 takes at most {MAX_TEXT_TOKENS}")
        if not (math.isfinite(self.guidance) and self.guidance >= 0):
            raise ValueError(f"guidance={self.guidance!r}: expected a finite number >= 0 (FLUX.1-dev's default 3.5)")


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> tokens [B, (h / 2) (w / 2), 4C], channels outermost in each 2x2 patch
    (the pipeline's `_pack_latents`)."""
    b, c, h, w = latents.shape
    x = latents.reshape(b, c, h // PACK, PACK, w // PACK, PACK)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // PACK) * (w // PACK), c * PACK * PACK)


def unpack_latents(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The inverse of `pack_latents`: [B, (h / 2) (w / 2), 4C] -> [B, C, h, w]."""
    b, _, d = tokens.shape
    c = d // (PACK * PACK)
    x = tokens.reshape(b, h // PACK, w // PACK, c, PACK, PACK)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def image_ids(h: int, w: int, first: float = 0.0) -> torch.Tensor:
    """Position ids [(h / 2)(w / 2), 3] of a packed latent grid: (first, row, column) per token,
    row-major as `pack_latents` orders them (the pipeline's `_prepare_latent_image_ids`; Kontext
    gives its source image's tokens first = 1)."""
    rows, cols = h // PACK, w // PACK
    ids = torch.zeros(rows, cols, 3)
    ids[..., 0] = first
    ids[..., 1] = torch.arange(rows)[:, None]
    ids[..., 2] = torch.arange(cols)[None, :]
    return ids.reshape(rows * cols, 3)


@register_adapter("FluxPipeline")
class FluxAdapter(DiffusionModelBase):
    options_class = FluxOptions
    # VAE factor 8 x the 2x2 packing (every FLUX.1 checkpoint; `latent_shape` checks the loaded one).
    size_multiple = 16
    editing_hint = "FluxKontextPipeline (FLUX.1-Kontext-dev)"
    # The joint attention of the double-stream blocks (image: to_*, text: add_*_proj, to_add_out)
    # and, by the same names, the single-stream blocks' q/k/v (PEFT matches name suffixes).
    default_lora_targets = (
        "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
        "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
    )

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
        from transformers import AutoTokenizer, CLIPTextModel, T5EncoderModel

        super().__init__(cfg, path, device)

        def load(cls, sub):
            return self.load_pretrained(cls, sub).to(device)

        self.transformer = load(FluxTransformer2DModel, "transformer")
        self.vae = load(AutoencoderKL, "vae")
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler")
        self.pipeline = self._pipeline_class()(
            scheduler=self.scheduler, vae=self.vae, transformer=self.transformer,
            text_encoder=load(CLIPTextModel, "text_encoder"),
            tokenizer=AutoTokenizer.from_pretrained(path, subfolder="tokenizer"),
            text_encoder_2=load(T5EncoderModel, "text_encoder_2"),
            tokenizer_2=AutoTokenizer.from_pretrained(path, subfolder="tokenizer_2"),
        )
        self.pipeline.set_progress_bar_config(disable=True)
        self.vae_scale = self.pipeline.vae_scale_factor
        self.setup_trainable()

    def _pipeline_class(self):
        from diffusers import FluxPipeline

        return FluxPipeline

    # --- what trains ---------------------------------------------------------------------
    def trainable_module(self) -> nn.Module:
        return self.transformer

    def frozen_modules(self) -> list[nn.Module]:
        return [self.vae, self.pipeline.text_encoder, self.pipeline.text_encoder_2]

    def fsdp_wrap_classes(self):
        from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock, FluxTransformerBlock

        return (FluxTransformerBlock, FluxSingleTransformerBlock)

    # --- shapes and schedule -------------------------------------------------------------
    def _grid(self, height: int, width: int, num_frames: int) -> tuple[int, int]:
        check_image_only(type(self).__name__, num_frames)
        factor = self.vae_scale * PACK
        why = f"VAE factor {self.vae_scale} x the 2x2 packing"
        check_multiple("rollout.sampling_options.height", height, factor, why)
        check_multiple("rollout.sampling_options.width", width, factor, why)
        return height // self.vae_scale, width // self.vae_scale

    def latent_shape(self, height: int, width: int, num_frames: int = 1) -> tuple[int, ...]:
        """[latent_channels, height / 8, width / 8]: the VAE's latent of one image."""
        h, w = self._grid(height, width, num_frames)
        return (self.vae.config.latent_channels, h, w)

    def schedule_mu(self, height: int, width: int, num_frames: int = 1) -> float:
        """The pipeline's shift: `calculate_shift` of the packed image token count."""
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        h, w = self._grid(height, width, num_frames)
        config = self.scheduler.config
        return float(calculate_shift(
            (h // PACK) * (w // PACK),
            config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5), config.get("max_shift", 1.15),
        ))

    def base_sigmas(self, num_steps: int) -> list[float]:
        return linspace_to_one_over_n(num_steps)

    # --- conditioning --------------------------------------------------------------------
    def _encode_text(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """T5 embeddings [B, L, D] and CLIP pooled embeddings [B, P] of `texts` (the pipeline's)."""
        embeds, pooled, _ = self.pipeline.encode_prompt(
            prompt=texts, prompt_2=None, device=self.device, max_sequence_length=self.options.max_sequence_length,
        )
        return embeds, pooled

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        """Each prompt's T5 and pooled CLIP embeddings; the negative prompt's for every prompt when
        one is given (`has_negative` 1), zeros otherwise (`has_negative` 0: no true CFG)."""
        return Conditioning(self._text_tensors(list(prompts), negative_prompt))

    def _text_tensors(self, prompts: list[str], negative_prompt: str) -> dict[str, torch.Tensor]:
        embeds, pooled = self._encode_text(prompts)
        n = len(prompts)
        if negative_prompt:
            neg, neg_pooled = self._encode_text([negative_prompt])
            neg, neg_pooled = neg.expand(n, -1, -1).contiguous(), neg_pooled.expand(n, -1).contiguous()
        else:
            neg, neg_pooled = torch.zeros_like(embeds), torch.zeros_like(pooled)
        has_negative = torch.full((n,), 1.0 if negative_prompt else 0.0, device=embeds.device)
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled, "negative_prompt_embeds": neg,
                "negative_pooled_prompt_embeds": neg_pooled, "has_negative": has_negative}

    # --- forward -------------------------------------------------------------------------
    def _guidance(self, batch: int) -> torch.Tensor | None:
        """The distilled guidance per sample (float32, as the pipeline passes it), or None for a
        checkpoint without the embedding (FLUX.1-schnell)."""
        if not self.transformer.config.guidance_embeds:
            return None
        return torch.full((batch,), float(self.options.guidance), device=self.device, dtype=torch.float32)

    def _transformer_velocity(self, tokens: torch.Tensor, sigma: torch.Tensor, embeds: torch.Tensor,
                              pooled: torch.Tensor, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """One transformer forward over packed tokens [B, S, D] at sigma [B]; fp32 [B, keep, D],
        the output of the first `keep` tokens (the noise tokens: Kontext appends its source's)."""
        txt_ids = torch.zeros(embeds.shape[1], 3, device=self.device, dtype=self.dtype)
        return self.transformer(
            hidden_states=tokens.to(self.dtype),
            timestep=sigma.to(self.dtype),
            guidance=self._guidance(tokens.shape[0]),
            pooled_projections=pooled.to(self.dtype),
            encoder_hidden_states=embeds.to(self.dtype),
            txt_ids=txt_ids,
            img_ids=ids.to(self.device, self.dtype),
            return_dict=False,
        )[0][:, :keep].to(torch.float32)

    def _guided(self, tokens, sigma, cond, ids, guidance_scale: float, keep: int) -> torch.Tensor:
        """The velocity of the first `keep` of `tokens` [B, S, D] with each sample's guidance
        (module docstring): true CFG for the samples with a negative prompt when
        `guidance_scale` > 1."""
        has_negative = cond["has_negative"].to(torch.bool)
        if not (guidance_scale > 1.0 and bool(has_negative.any())):
            return self._transformer_velocity(tokens, sigma, cond["prompt_embeds"], cond["pooled_prompt_embeds"], ids, keep)
        out = self._transformer_velocity(
            torch.cat([tokens, tokens]), torch.cat([sigma, sigma]),
            torch.cat([cond["negative_prompt_embeds"], cond["prompt_embeds"]]),
            torch.cat([cond["negative_pooled_prompt_embeds"], cond["pooled_prompt_embeds"]]), ids, keep,
        )
        neg, pos = out.chunk(2)
        return torch.where(has_negative[:, None, None], neg + guidance_scale * (pos - neg), pos)

    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        """Velocity (fp32, [B, C, h, w]) at per-sample sigma [B]: the distilled guidance always,
        true CFG as the module docstring says."""
        b, _, h, w = latents.shape
        sigma = sigma.to(torch.float32).reshape(-1).to(self.device)
        if sigma.shape[0] != b:
            raise ValueError(f"sigma has {sigma.shape[0]} values for a batch of {b} latents")
        tokens = pack_latents(latents.to(self.device, torch.float32))
        out = self._guided(tokens, sigma, conditioning.to(self.device), image_ids(h, w), guidance_scale, tokens.shape[1])
        return unpack_latents(out, h, w)

    # --- decoding ------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [B, C, h, w] -> uint8 images [B, 8h, 8w, 3]."""
        if latents.ndim != 4:
            raise ValueError(f"FLUX latents are [B, C, h, w], got shape {tuple(latents.shape)}")
        config = self.vae.config
        z = latents.to(self.device, self.vae.dtype) / config.scaling_factor + config.shift_factor
        image = self.vae.decode(z, return_dict=False)[0]
        image = (image.float() / 2 + 0.5).clamp(0, 1)
        return (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()

    # --- saving --------------------------------------------------------------------------
    def save_lora(self, folder: str) -> None:
        """diffusers' LoRA format with the adapter config (rank, alpha, targets) in the file's
        metadata: the pipeline's `load_lora_weights(folder)` loads it at the trained scale."""
        from peft.utils import get_peft_model_state_dict

        self._pipeline_class().save_lora_weights(
            folder, transformer_lora_layers=get_peft_model_state_dict(self.transformer),
            transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
        )

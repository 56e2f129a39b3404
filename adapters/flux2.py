"""FLUX.2 text-to-image (`Flux2KleinPipeline`, and `Flux2Pipeline` for [dev]): the adapters.

Loads the pipeline's components with diffusers' and transformers' `from_pretrained` (through
`self.load_pretrained`): the `Flux2Transformer2DModel` (trained; LoRA on the attention
projections of the double-stream blocks and the fused projection of the single-stream ones),
the `AutoencoderKLFlux2` VAE (32 channels, 8 px per latent, a batch norm over 2x2 patches) and
the Qwen3 text encoder. The conventions, the same at rollout and in training because both go
through this one file, are the pipeline's (diffusers 0.42.1, `pipeline_flux2_klein.py`):

- **latents**: what the pipeline denoises, the VAE latent patchified 2x2 (channels outermost:
  [32, h, w] -> [128, h/2, w/2]) and normalised by the VAE's batch-norm running statistics;
  the engine carries it as [128, H/16, W/16], so a standard-normal draw is the pipeline's
  initial noise. `predict_velocity` flattens it into the transformer's tokens [B, HW, 128]
  (patch size 1) with 4-axis position ids (t, h, w, l) = (0, row, column, 0); the text tokens'
  ids are (0, 0, 0, index);
- **timestep**: sigma itself (the pipeline's `t / 1000`);
- **schedule**: `linspace(1, 1/N, N)` sigmas, shifted by the pipeline's `compute_empirical_mu`
  of the image token count *and the step count* (a fit BFL made; not diffusers' linear
  `calculate_shift`), so `sigmas` computes mu itself;
- **prompt embeddings**: the Qwen3 chat template (user turn, generation prompt, thinking off)
  padded to `max_sequence_length` tokens, and the hidden states of `text_encoder_out_layers`
  (9, 18, 27) stacked per token ([B, L, 3 x hidden]); the transformer attends to every one of
  the L tokens, padding included (the pipeline passes no mask), so every prompt has the same
  length and no mask travels;
- **guidance**: the distilled klein checkpoints (model_index.json `is_distilled: true`) take
  none: `rollout.sampling_options.guidance_scale` must be 1 (the pipeline ignores it with a warning; a recipe
  that sets it is refused at load). The base checkpoints run CFG with the empty negative
  prompt when guidance_scale > 1: `neg + s (cond - neg)`, one batched forward over
  [uncond; cond]. `model.adapter_options.is_distilled` overrides the checkpoint's flag as the
  pipeline's own `is_distilled` argument does.

`decode` un-normalises, unpatchifies, runs the VAE and returns uint8 [B, H, W, 3]. Sizes must be
multiples of 16 (VAE factor 8 x the 2x2 patch); another raises `ValueError` with the nearest
valid values (the pipeline would silently round them down).

FLUX.2 [dev] (`Flux2Pipeline`, `Flux2DevAdapter`) is the same adapter: the two pipelines share
the transformer class, VAE, latent layout, position ids and schedule line for line, and differ
only where the adapter delegates to the pipeline or reads the transformer's config: the text
encoder (Mistral-3 through its Pixtral processor's chat template over the pipeline's system
message, hidden states 10/20/30; `_build_pipeline`) and the guidance (dev's transformer has a
guidance embedding, which takes `rollout.sampling_options.guidance_scale` in the one forward a step; no CFG).

Its tiny models are in `adapters/tiny/flux2.py`,
its view for the planner in `adapters/plan/flux2.py`.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from omni_rl.option import option
from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter
from omni_rl.models.diffusion import PromptLengthOptions, check_image_only, check_multiple, linspace_to_one_over_n


_EMBEDS = ("prompt_embeds", "negative_prompt_embeds")
# The 2x2 patch the pipeline folds into the channels before packing (`_patchify_latents`).
PATCH = 2


@dataclass
class Flux2KleinOptions(PromptLengthOptions):
    """FLUX.2 [klein]'s knobs (`model.adapter_options`), defaulting to the pipeline's."""

    max_sequence_length: int = option(512, "Text tokens (chat template included) the prompt is padded or cut to; the transformer attends to all of them (the pipeline's max_sequence_length, 512).")
    text_encoder_out_layers: list[int] = option([9, 18, 27], "Qwen3 hidden-state indices stacked per token into the prompt embedding (the pipeline's text_encoder_out_layers); their count x the encoder's hidden size must be the transformer's joint_attention_dim.")
    is_distilled: Optional[bool] = option(None, "The step-distilled checkpoints take no CFG (rollout.sampling_options.guidance_scale must be 1); the base ones run CFG with the empty negative prompt when rollout.sampling_options.guidance_scale > 1. null = the checkpoint's model_index.json is_distilled, as the pipeline reads it.")

    def check(self) -> None:
        super().check()
        check_layers(self.text_encoder_out_layers, "[9, 18, 27]")


def check_layers(layers, default: str) -> None:
    if not layers or not all(isinstance(i, int) and i >= 0 for i in layers):
        raise ValueError(f"text_encoder_out_layers={list(layers)!r}: expected hidden-state indices (integers >= 0), "
                         f"e.g. the pipeline's {default}")


def read_is_distilled(folder: Path) -> bool:
    """The checkpoint's `is_distilled` (model_index.json; the pipeline's default False when absent)."""
    try:
        index = json.loads((Path(folder) / "model_index.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(index.get("is_distilled", False))


def image_ids(h: int, w: int) -> torch.Tensor:
    """[h w, 4] position ids (0, row, column, 0): the pipeline's `_prepare_latent_ids`."""
    return torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.arange(1))


def text_ids(length: int) -> torch.Tensor:
    """[L, 4] position ids (0, 0, 0, index): the pipeline's `_prepare_text_ids`."""
    return torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(length))


def patchify(z: torch.Tensor) -> torch.Tensor:
    """VAE latent [B, C, h, w] -> [B, 4C, h/2, w/2], channel c's 2x2 patch at 4c..4c+3 (the
    pipeline's `_patchify_latents`)."""
    b, c, h, w = z.shape
    return z.view(b, c, h // PATCH, PATCH, w // PATCH, PATCH).permute(0, 1, 3, 5, 2, 4).reshape(
        b, c * PATCH * PATCH, h // PATCH, w // PATCH)


def unpatchify(x: torch.Tensor) -> torch.Tensor:
    """The inverse of `patchify` (the pipeline's `_unpatchify_latents`)."""
    b, c4, h, w = x.shape
    c = c4 // (PATCH * PATCH)
    return x.reshape(b, c, PATCH, PATCH, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c, h * PATCH, w * PATCH)


def compute_mu(image_tokens: int, num_steps: int) -> float:
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    return float(compute_empirical_mu(image_seq_len=image_tokens, num_steps=num_steps))


@register_adapter("Flux2KleinPipeline")
class Flux2KleinAdapter(DiffusionModelBase):
    options_class = Flux2KleinOptions
    # VAE factor 8 x the 2x2 patch (every FLUX.2 checkpoint; `latent_shape` checks the loaded one).
    size_multiple = 16
    # The attention projections of the double-stream blocks (image: to_*, text: add_*_proj,
    # to_add_out) and the single-stream blocks' fused qkv+MLP input projection (PEFT matches
    # name suffixes; the single blocks' `attn.to_out` is not a suffix-matchable Linear name).
    default_lora_targets = (
        "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
        "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
        "attn.to_qkv_mlp_proj",
    )

    @classmethod
    def check_model_limits(cls, cfg, configs) -> None:
        """A guidance scale the distilled checkpoint does not take, read from its
        model_index.json before any weights load."""
        distilled = cfg.model.adapter_options.is_distilled
        if distilled is None:
            distilled = read_is_distilled(configs.folder)
        check_guidance(cfg.model.adapter, distilled, cfg.rollout.sampling_options.guidance_scale)

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel

        super().__init__(cfg, path, device)
        self.transformer = self.load_pretrained(Flux2Transformer2DModel, "transformer").to(device)
        self.vae = self.load_pretrained(AutoencoderKLFlux2, "vae").to(device)
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler")
        self._build_pipeline(path)
        self.pipeline.set_progress_bar_config(disable=True)
        self.vae_scale = self.pipeline.vae_scale_factor
        self._check_text_width()
        self.setup_trainable()

    def _build_pipeline(self, path: str) -> None:
        """`self.text_encoder`, `self.pipeline` (what encodes prompts) and `self.true_cfg`
        (whether guidance is CFG over a negative prompt); FLUX.2 [dev] builds its own."""
        from diffusers import Flux2KleinPipeline
        from transformers import AutoTokenizer, Qwen3ForCausalLM

        self.text_encoder = self.load_pretrained(Qwen3ForCausalLM, "text_encoder").to(self.device)
        self.is_distilled = self.options.is_distilled
        if self.is_distilled is None:
            self.is_distilled = read_is_distilled(Path(path))
        self.true_cfg = not self.is_distilled
        self.pipeline = Flux2KleinPipeline(
            scheduler=self.scheduler, vae=self.vae, text_encoder=self.text_encoder,
            tokenizer=AutoTokenizer.from_pretrained(path, subfolder="tokenizer"), transformer=self.transformer,
            is_distilled=self.is_distilled,
        )

    def _check_text_width(self) -> None:
        layers = list(self.options.text_encoder_out_layers)
        config = getattr(self.text_encoder.config, "text_config", self.text_encoder.config)  # Mistral3: its LM's
        if max(layers) > config.num_hidden_layers:
            raise ValueError(f"model.adapter_options.text_encoder_out_layers={layers}: the text encoder has hidden states 0.."
                             f"{config.num_hidden_layers}")
        width, joint = len(layers) * config.hidden_size, self.transformer.config.joint_attention_dim
        if width != joint:
            raise ValueError(f"model.adapter_options.text_encoder_out_layers={layers}: {len(layers)} layers x hidden size "
                             f"{config.hidden_size} = {width}, but the transformer takes {joint}; use "
                             f"{joint // config.hidden_size} layers")

    # --- what trains ---------------------------------------------------------------------
    def trainable_module(self) -> nn.Module:
        return self.transformer

    def frozen_modules(self) -> list[nn.Module]:
        return [self.vae, self.text_encoder]

    def fsdp_wrap_classes(self):
        from diffusers.models.transformers.transformer_flux2 import Flux2SingleTransformerBlock, Flux2TransformerBlock

        return (Flux2TransformerBlock, Flux2SingleTransformerBlock)

    # --- shapes and schedule -------------------------------------------------------------
    def _grid(self, height: int, width: int, num_frames: int) -> tuple[int, int]:
        """(rows, columns) of the patchified latent."""
        check_image_only("Flux2KleinPipeline", num_frames)
        factor = self.vae_scale * PATCH
        why = f"VAE factor {self.vae_scale} x the 2x2 patch"
        check_multiple("rollout.sampling_options.height", height, factor, why)
        check_multiple("rollout.sampling_options.width", width, factor, why)
        return height // factor, width // factor

    def latent_shape(self, height: int, width: int, num_frames: int = 1) -> tuple[int, ...]:
        """[4 x latent channels, H/16, W/16]: the patchified, normalised latent of one image."""
        h, w = self._grid(height, width, num_frames)
        return (self.transformer.config.in_channels, h, w)

    def schedule_mu(self, height: int, width: int, num_frames: int = 1, num_steps: int | None = None) -> float:
        """The pipeline's `compute_empirical_mu` of the image token count and the step count."""
        if num_steps is None:
            raise ValueError("FLUX.2's shift depends on the step count too: pass num_steps to schedule_mu()")
        h, w = self._grid(height, width, num_frames)
        return compute_mu(h * w, num_steps)

    def base_sigmas(self, num_steps: int) -> list[float] | None:
        if self.scheduler.config.get("use_flow_sigmas", False):  # the pipeline then leaves the spacing to it
            return None
        return linspace_to_one_over_n(num_steps)

    def sigmas(self, num_steps: int, height: int | None = None, width: int | None = None,
               num_frames: int = 1) -> torch.Tensor:
        """The pipeline's schedule, [num_steps + 1] fp32 ending in 0: `base_sigmas` shifted by
        mu of this geometry *and step count* (the base class's `sigmas` knows mu of the
        geometry alone), on a copy of the scheduler."""
        if height is None or width is None:
            raise ValueError("FLUX.2's schedule shifts with the output's token count: pass height and width to sigmas()")
        mu = self.schedule_mu(height, width, num_frames, num_steps)
        cache = self.__dict__.setdefault("_sigma_cache", {})
        key = (num_steps, mu)
        if key not in cache:
            scheduler = copy.deepcopy(self.scheduler)
            spacing = self.base_sigmas(num_steps)
            if spacing is None:
                scheduler.set_timesteps(num_steps, device="cpu", mu=mu)
            else:
                scheduler.set_timesteps(sigmas=[float(s) for s in spacing], device="cpu", mu=mu)
            cache[key] = scheduler.sigmas.detach().to(torch.float32).cpu()
        return cache[key]

    # --- conditioning --------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        """Each prompt's embeddings [B, L, D] (L = max_sequence_length) through the pipeline's
        `encode_prompt`, and, for CFG on a base checkpoint, the negative prompt's (the pipeline
        always uses ""; `rollout.sampling_options.negative_prompt` replaces it)."""
        def encode(texts):
            embeds, _ = self.pipeline.encode_prompt(
                prompt=texts, device=self.device, max_sequence_length=self.options.max_sequence_length,
                text_encoder_out_layers=tuple(self.options.text_encoder_out_layers),
            )
            return embeds

        tensors = {"prompt_embeds": encode(list(prompts))}
        if self.true_cfg:
            tensors["negative_prompt_embeds"] = encode([negative_prompt]).expand(len(prompts), -1, -1).contiguous()
        return Conditioning(tensors)

    # --- forward -------------------------------------------------------------------------
    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        """Velocity (fp32, [B, C, h, w]) at per-sample sigma [B], with CFG when the checkpoint
        is not distilled and `guidance_scale` > 1 (module docstring)."""
        b, c, h, w = latents.shape
        sigma = sigma.to(torch.float32).reshape(-1).to(self.device)
        if sigma.shape[0] != b:
            raise ValueError(f"sigma has {sigma.shape[0]} values for a batch of {b} latents")
        tokens = latents.to(self.device, torch.float32).reshape(b, c, h * w).permute(0, 2, 1).to(self.dtype)
        cond = conditioning.to(self.device)
        guided = guidance_scale > 1.0 and self.true_cfg
        parts = ("negative_prompt_embeds", "prompt_embeds") if guided else ("prompt_embeds",)
        text = torch.cat([cond[name] for name in parts]).to(self.dtype)
        copies = len(parts)
        guidance = None
        if self.transformer.config.guidance_embeds:  # a guidance-distilled transformer reads the scale
            guidance = torch.full((b * copies,), float(guidance_scale), device=self.device, dtype=self.dtype)
        out = self.transformer(
            hidden_states=torch.cat([tokens] * copies),
            encoder_hidden_states=text,
            timestep=torch.cat([sigma] * copies).to(self.dtype),
            img_ids=image_ids(h, w).to(self.device),
            txt_ids=text_ids(text.shape[1]).to(self.device),
            guidance=guidance,
            return_dict=False,
        )[0].to(torch.float32)
        if guided:
            uncond, cond_v = out.chunk(2)
            out = uncond + guidance_scale * (cond_v - uncond)
        return out.permute(0, 2, 1).reshape(b, c, h, w)

    # --- decoding ------------------------------------------------------------------------
    def _bn_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps).to(like.device, like.dtype)
        return mean, std

    def raw_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """The normalised patchified latent -> the VAE's [B, 32, h, w] (the pipeline's last step
        before `vae.decode`)."""
        x = latents.to(self.device, self.vae.dtype)
        mean, std = self._bn_stats(x)
        return unpatchify(x * std + mean)

    def normalised_latents(self, z: torch.Tensor) -> torch.Tensor:
        """The inverse of `raw_latents` (the pipeline's `_encode_vae_image` after the encoder)."""
        x = patchify(z.to(self.device, self.vae.dtype))
        mean, std = self._bn_stats(x)
        return (x - mean) / std

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [B, 128, h, w] -> uint8 images [B, 16h, 16w, 3]."""
        if latents.ndim != 4:
            raise ValueError(f"FLUX.2 latents are [B, C, h, w], got shape {tuple(latents.shape)}")
        image = self.vae.decode(self.raw_latents(latents), return_dict=False)[0]
        image = (image.float() / 2 + 0.5).clamp(0, 1)
        return (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()

    # --- saving --------------------------------------------------------------------------
    def save_lora(self, folder: str) -> None:
        """diffusers' LoRA format with the adapter config (rank, alpha, targets) in the file's
        metadata: the pipeline's `load_lora_weights(folder)` (`Flux2LoraLoaderMixin`, both FLUX.2
        pipelines) loads it at the trained scale."""
        from peft.utils import get_peft_model_state_dict

        type(self.pipeline).save_lora_weights(
            folder, transformer_lora_layers=get_peft_model_state_dict(self.transformer),
            transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
        )


@dataclass
class Flux2DevOptions(PromptLengthOptions):
    """FLUX.2 [dev]'s knobs (`model.adapter_options`), defaulting to the pipeline's."""

    max_sequence_length: int = option(512, "Text tokens (system prompt and chat template included) the prompt is padded or cut to; the transformer attends to all of them (the pipeline's max_sequence_length, 512).")
    text_encoder_out_layers: list[int] = option([10, 20, 30], "Mistral-3 hidden-state indices stacked per token into the prompt embedding (the pipeline's text_encoder_out_layers); their count x the encoder's hidden size must be the transformer's joint_attention_dim.")

    def check(self) -> None:
        super().check()
        check_layers(self.text_encoder_out_layers, "[10, 20, 30]")


@register_adapter("Flux2Pipeline")
class Flux2DevAdapter(Flux2KleinAdapter):
    """FLUX.2 [dev] (`Flux2Pipeline`): the klein adapter's transformer, latents, positions,
    schedule and decoding, with the pipeline's Mistral-3 encoding (its processor's chat template
    over the pipeline's system message and the prompt, hidden states 10/20/30) and its guidance:
    `rollout.sampling_options.guidance_scale` goes into the transformer's guidance embedding (the pipeline's
    default 4.0), one forward a step, no CFG and no negative prompt."""

    options_class = Flux2DevOptions

    @classmethod
    def check_model_limits(cls, cfg, configs) -> None:
        """Any guidance scale: it is an input of the guidance embedding."""

    def _build_pipeline(self, path: str) -> None:
        from diffusers import Flux2Pipeline
        from transformers import AutoProcessor, Mistral3ForConditionalGeneration

        # Before the text encoder: a klein folder's Qwen3 config would build a default-sized Mistral-3.
        if not self.transformer.config.guidance_embeds:
            raise ValueError(f"{path}: Flux2Pipeline's transformer has no guidance embedding (guidance_embeds: false); "
                             f"a klein checkpoint loads with model.adapter=Flux2KleinPipeline")
        self.text_encoder = self.load_pretrained(Mistral3ForConditionalGeneration, "text_encoder").to(self.device)
        self.true_cfg = False
        self.pipeline = Flux2Pipeline(
            scheduler=self.scheduler, vae=self.vae, text_encoder=self.text_encoder,
            tokenizer=AutoProcessor.from_pretrained(path, subfolder="tokenizer"), transformer=self.transformer,
        )


def check_guidance(adapter: str, distilled: bool, guidance_scale: float) -> None:
    """ValueError for a guidance scale a distilled checkpoint does not take."""
    if distilled and guidance_scale != 1.0:
        raise ValueError(
            f"rollout.sampling_options.guidance_scale={guidance_scale:g}: {adapter} on a step-distilled checkpoint (is_distilled) takes "
            f"no guidance; set rollout.sampling_options.guidance_scale=1, or use a -base checkpoint for CFG"
        )

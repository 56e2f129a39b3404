"""Z-Image text-to-image (`ZImagePipeline`: Z-Image and Z-Image-Turbo): the adapter.

Loads the pipeline's components with diffusers' and transformers' `from_pretrained` (through
`self.load_pretrained`): the single-stream `ZImageTransformer2DModel` (trained; LoRA on the
attention projections and the SwiGLU MLP of every block, Flow-Factory's Z-Image targets), the
16-channel `AutoencoderKL` (FLUX's VAE: 8 px a latent, `scaling_factor` / `shift_factor`) and
the Qwen3 text encoder (`Qwen3Model`) with its tokenizer.

The conventions, the same at rollout and in training because both go through this one file:

- **prompt embeddings**: the pipeline's own `encode_prompt`: each prompt through the tokenizer's
  chat template (one user turn, `enable_thinking=True`, the generation prompt added), padded to
  `max_sequence_length`, and the Qwen3 hidden state of the *second-to-last* layer
  (`hidden_states[-2]`) at the prompt's real tokens only. Each prompt keeps its own length; they
  travel in a `Conditioning` with masks, and `predict_velocity` hands the transformer each
  sample's unpadded embedding as the pipeline does (a list of tensors: the transformer pads each
  caption to a multiple of 32 with a learned pad token, so a caption's padding is not inert and
  must be the pipeline's, not the batch's);
- **latents**: [16, H/8, W/8], normalised as the pipeline denoises them (the VAE's latent z as
  `(z - shift_factor) * scaling_factor`), so a standard-normal draw is the pipeline's initial
  noise; the transformer patches 2x2 latent pixels itself (a list of [16, 1, h, w] tensors);
- **timestep and sign**: the transformer is conditioned on `(1000 - t) / 1000` with
  `t = sigma * 1000` (1 - sigma: Z-Image counts time the other way) and predicts minus the
  velocity; `predict_velocity` returns the velocity x_1 - x_0 the engine steps with;
- **schedule**: the pipeline's `linspace(1, 1/N, N)` sigmas (`get_default_z_image_sigmas`)
  through the checkpoint's scheduler: Z-Image-Turbo's shifts them statically (shift 3); a
  scheduler with `use_dynamic_shifting` gets the pipeline's `mu` of the image token count;
- **guidance**: the pipeline's CFG `pos + s (pos - neg)` with s = `rollout.sampling_options.guidance_scale - 1`
  (this project's scale g is `neg + g (pos - neg)`, the same thing: the pipeline's
  `guidance_scale=0`, Z-Image-Turbo's distilled no-CFG sampling, is g = 1; its default 5 is
  g = 6). The pipeline's two refinements are adapter options with its defaults:
  `cfg_normalization` (0 = off; r caps each sample's guided norm at r x the conditional's) and
  `cfg_truncation` (1 = off; CFG is dropped for a sample whose 1 - sigma is past it). Each is
  decided per sample, so a packed batch straddling the truncation point equals its samples alone.

`decode` un-normalises, runs the VAE and returns uint8 [B, H, W, 3]. Sizes must be multiples of
16 (VAE factor 8 x patch size 2); another raises `ValueError` with the nearest valid values, at
config load (`size_multiple`), and sizes past the transformer's rotary table
(`check_model_limits`) are refused before the model loads.

Its tiny models are in `adapters/tiny/z_image.py`,
its view for the planner in `adapters/plan/z_image.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from omni_rl.option import option
from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter
from omni_rl.models.diffusion import PromptLengthOptions, check_image_only, check_multiple
from omni_rl.models.limits import check_positions


_MASKS = {"prompt_embeds": "prompt_embeds_mask", "negative_prompt_embeds": "negative_prompt_embeds_mask"}
# The transformer pads each caption and each image to a multiple of this many tokens
# (diffusers' `SEQ_MULTI_OF`); the image's first rotary position follows the padded caption.
SEQ_MULTIPLE = 32


@dataclass
class ZImageOptions(PromptLengthOptions):
    """Z-Image's options (`model.adapter_options`): the text length and the pipeline's two CFG refinements,
    each at `ZImagePipeline.__call__`'s default."""

    max_sequence_length: int = option(512, "Prompt tokens (chat template included) the Qwen3 encoder reads: longer prompts are cut (diffusers' max_sequence_length, default 512). Only the real tokens are kept, so it bounds the text; it pads nothing.")
    cfg_normalization: float = option(0.0, "ZImagePipeline's cfg_normalization: with CFG, each sample's guided prediction is scaled down to at most this many times the norm of its conditional prediction (True in diffusers is 1.0); 0 = off (the pipeline's default False).")
    cfg_truncation: float = option(1.0, "ZImagePipeline's cfg_truncation: CFG is dropped for a sample whose normalised time 1 - sigma is past this value (late, low-noise steps); 1 = never (the pipeline's default).")

    def check(self) -> None:
        super().check()
        if not (math.isfinite(self.cfg_normalization) and self.cfg_normalization >= 0.0):
            raise ValueError(f"cfg_normalization={self.cfg_normalization!r}: expected a finite ratio >= 0 (0 = off)")
        if not (math.isfinite(self.cfg_truncation) and 0.0 <= self.cfg_truncation <= 1.0):
            raise ValueError(f"cfg_truncation={self.cfg_truncation!r}: expected a value in [0, 1] (1 = off)")


def guided(pos: torch.Tensor, neg: torch.Tensor, scale: float, normalization: float) -> torch.Tensor:
    """The pipeline's CFG of one batch of [B, ...] predictions: `pos + scale (pos - neg)`, and with
    `normalization` r > 0 each sample rescaled to r |pos| where its norm exceeds that."""
    pred = pos + scale * (pos - neg)
    if normalization > 0.0:
        ceiling = torch.linalg.vector_norm(pos.flatten(1), dim=1) * normalization
        norm = torch.linalg.vector_norm(pred.flatten(1), dim=1)
        factor = torch.where(norm > ceiling, ceiling / norm, torch.ones_like(norm))
        pred = pred * factor.view(-1, *([1] * (pred.dim() - 1)))
    return pred


def padded_caption_length(tokens: int) -> int:
    """Positions a caption of `tokens` takes in the transformer (padded to `SEQ_MULTIPLE`)."""
    return tokens + (-tokens) % SEQ_MULTIPLE


@register_adapter("ZImagePipeline")
class ZImageAdapter(DiffusionModelBase):
    options_class = ZImageOptions
    # VAE factor 8 x patch size 2 (every Z-Image checkpoint; `latent_shape` checks the loaded one).
    size_multiple = 16
    # Flow-Factory's Z-Image LoRA targets (src/flow_factory/models/z_image/z_image.py): the
    # attention projections and the SwiGLU MLP of every block (the refiners' too: PEFT matches
    # name suffixes).
    default_lora_targets = (
        "attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0",
        "feed_forward.w1", "feed_forward.w2", "feed_forward.w3",
    )

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
        from transformers import AutoTokenizer, Qwen3Model

        super().__init__(cfg, path, device)

        def load(cls, sub):
            return self.load_pretrained(cls, sub).to(device)

        self.transformer = load(ZImageTransformer2DModel, "transformer")
        self.vae = load(AutoencoderKL, "vae")
        self.text_encoder = load(Qwen3Model, "text_encoder")
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler")
        self.pipeline = ZImagePipeline(
            scheduler=self.scheduler, vae=self.vae, text_encoder=self.text_encoder,
            tokenizer=AutoTokenizer.from_pretrained(path, subfolder="tokenizer"), transformer=self.transformer,
        )
        self.pipeline.set_progress_bar_config(disable=True)
        self.vae_scale = self.pipeline.vae_scale_factor
        self.patch = self.transformer.config.all_patch_size[0]
        self.setup_trainable()

    # --- what trains ---------------------------------------------------------------------
    def trainable_module(self) -> nn.Module:
        return self.transformer

    def frozen_modules(self) -> list[nn.Module]:
        return [self.vae, self.text_encoder]

    def fsdp_wrap_classes(self):
        from diffusers.models.transformers.transformer_z_image import ZImageTransformerBlock

        return (ZImageTransformerBlock,)

    # --- config checks -------------------------------------------------------------------
    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        options = cfg.model.adapter_options
        if cfg.rollout.sampling_options.guidance_scale <= 1.0:
            for name, off in (("cfg_normalization", 0.0), ("cfg_truncation", 1.0)):
                value = getattr(options, name)
                if value != off:
                    raise ValueError(
                        f"model.adapter_options.{name}={value}: refines CFG, but rollout.sampling_options.guidance_scale="
                        f"{cfg.rollout.sampling_options.guidance_scale} runs none; set rollout.sampling_options.guidance_scale > 1 (the pipeline's "
                        f"guidance_scale + 1) or leave {name} at {off}"
                    )

    @classmethod
    def check_model_limits(cls, cfg, configs) -> None:
        transformer, vae = configs.get("transformer"), configs.get("vae")
        if not transformer:
            return
        scale = 2 ** (len(vae["block_out_channels"]) - 1) if vae and vae.get("block_out_channels") else 8
        patch = int((transformer.get("all_patch_size") or [2])[0])
        lens = transformer.get("axes_lens") or [1024, 512, 512]
        _check_positions(cfg.rollout.sampling_options.height, cfg.rollout.sampling_options.width, scale * patch, lens,
                         cfg.model.adapter_options.max_sequence_length)

    # --- shapes and schedule -------------------------------------------------------------
    def _grid(self, height: int, width: int, num_frames: int) -> tuple[int, int]:
        check_image_only("ZImagePipeline", num_frames)
        factor = self.vae_scale * self.patch
        why = f"VAE factor {self.vae_scale} x patch size {self.patch}"
        check_multiple("rollout.sampling_options.height", height, factor, why)
        check_multiple("rollout.sampling_options.width", width, factor, why)
        _check_positions(height, width, factor, self.transformer.config.axes_lens, self.options.max_sequence_length)
        return height // self.vae_scale, width // self.vae_scale

    def latent_shape(self, height: int, width: int, num_frames: int = 1) -> tuple[int, ...]:
        """[16, height / 8, width / 8]: the VAE's latent of one image."""
        h, w = self._grid(height, width, num_frames)
        return (self.transformer.config.in_channels, h, w)

    def schedule_mu(self, height: int, width: int, num_frames: int = 1) -> float | None:
        """The pipeline's `mu` (`calculate_shift` of the image token count), for a scheduler that
        shifts dynamically; None for a static shift (Z-Image-Turbo's), which ignores it."""
        from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift

        h, w = self._grid(height, width, num_frames)
        config = self.scheduler.config
        if not config.get("use_dynamic_shifting", False):
            return None
        return float(calculate_shift(
            (h // self.patch) * (w // self.patch),
            config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5), config.get("max_shift", 1.15),
        ))

    def base_sigmas(self, num_steps: int) -> list[float]:
        from diffusers.pipelines.z_image.pipeline_z_image import get_default_z_image_sigmas

        if num_steps < 1:
            raise ValueError(f"num_steps={num_steps}: expected at least 1 denoising step")
        return get_default_z_image_sigmas(num_steps)

    # --- conditioning --------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        """Each prompt's embeddings [B, L, D] (L: the longest prompt's real tokens) with their
        mask, and the negative prompt's, through the pipeline's `encode_prompt` (module docstring)."""
        tensors = {}
        for name, texts in (("prompt_embeds", list(prompts)), ("negative_prompt_embeds", [negative_prompt])):
            # `encode_prompt` writes the templated text into the list it is given: a fresh list.
            embeds, _ = self.pipeline.encode_prompt(
                prompt=list(texts), device=self.device, do_classifier_free_guidance=False,
                max_sequence_length=self.options.max_sequence_length,
            )
            lengths = [e.shape[0] for e in embeds]
            padded = torch.nn.utils.rnn.pad_sequence(list(embeds), batch_first=True)
            mask = (torch.arange(padded.shape[1])[None, :] < torch.tensor(lengths)[:, None]).to(torch.long)
            tensors[name], tensors[_MASKS[name]] = padded, mask.to(padded.device)
        for name, mask in _MASKS.items():  # one negative for every prompt
            if tensors[name].shape[0] != len(prompts):
                tensors[name] = tensors[name].expand(len(prompts), -1, -1).contiguous()
                tensors[mask] = tensors[mask].expand(len(prompts), -1).contiguous()
        return Conditioning(tensors, dict(_MASKS))

    # --- forward -------------------------------------------------------------------------
    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        """Velocity (fp32, [B, C, h, w]) at per-sample sigma [B], with the pipeline's CFG (scale
        `guidance_scale - 1`) on the samples the truncation leaves it for (module docstring)."""
        b = latents.shape[0]
        sigma = sigma.to(torch.float32).reshape(-1).to(self.device)
        if sigma.shape[0] != b:
            raise ValueError(f"sigma has {sigma.shape[0]} values for a batch of {b} latents")
        # The pipeline's timestep: t = sigma * 1000 as the scheduler computes it, then (1000 - t) / 1000.
        t = sigma * self.scheduler.config.num_train_timesteps
        timestep = (1000 - t) / 1000
        x = latents.to(self.device, self.dtype)
        cond = conditioning.to(self.device)
        scale = float(guidance_scale) - 1.0
        # Per sample, as the pipeline decides per step: no CFG past the truncation point.
        rows = [i for i, v in enumerate(timestep.tolist()) if not v > self.options.cfg_truncation] if scale > 0.0 else []
        captions = _unpadded(cond, "prompt_embeds", range(b)) + _unpadded(cond, "negative_prompt_embeds", rows)
        images = [x[i].unsqueeze(1) for i in [*range(b), *rows]]
        # The timestep stays fp32, as the pipeline passes it (the embedder casts after scaling).
        out = self.transformer(
            images, torch.cat([timestep, timestep[rows]]), [c.to(self.dtype) for c in captions], return_dict=False,
        )[0]
        out = torch.stack([o.float() for o in out]).squeeze(2)
        pred = out[:b]
        if rows:
            mixed = guided(pred[rows], out[b:], scale, self.options.cfg_normalization)
            pred = pred.index_copy(0, torch.tensor(rows, device=pred.device), mixed)
        return -pred

    # --- decoding ------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [B, C, h, w] -> uint8 images [B, 8h, 8w, 3]."""
        if latents.ndim != 4:
            raise ValueError(f"Z-Image latents are [B, C, h, w], got shape {tuple(latents.shape)}")
        config = self.vae.config
        z = latents.to(self.device, self.vae.dtype) / config.scaling_factor + config.shift_factor
        image = self.vae.decode(z, return_dict=False)[0]
        image = (image.float() / 2 + 0.5).clamp(0, 1)
        return (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()

    # --- saving --------------------------------------------------------------------------
    def save_lora(self, folder: str) -> None:
        """diffusers' LoRA format with the adapter config (rank, alpha, targets) in the file's
        metadata: `ZImagePipeline.load_lora_weights(folder)` (`ZImageLoraLoaderMixin`) loads it
        at the trained scale."""
        from diffusers import ZImagePipeline
        from peft.utils import get_peft_model_state_dict

        ZImagePipeline.save_lora_weights(
            folder, transformer_lora_layers=get_peft_model_state_dict(self.transformer),
            transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
        )


def _unpadded(cond: Conditioning, name: str, rows) -> list[torch.Tensor]:
    """Rows of a padded [B, L, D] embedding, each cut to its mask's real tokens (the pipeline's list)."""
    lengths = cond[_MASKS[name]].sum(1).tolist()
    return [cond[name][i, : int(lengths[i])] for i in rows]


def _check_positions(height: int, width: int, factor: int, axes_lens, max_sequence_length: int) -> None:
    """Sizes within the transformer's rotary table: `axes_lens[1]` / `[2]` token rows / columns of
    `factor` px; the caption (padded to 32 tokens) and the image's frame position after it within
    `axes_lens[0]`."""
    what = "ZImagePipeline's rotary table (its transformer's axes_lens)"
    check_positions("rollout.sampling_options.height", height, factor, int(axes_lens[1]), what)
    check_positions("rollout.sampling_options.width", width, factor, int(axes_lens[2]), what)
    if padded_caption_length(max_sequence_length) + 2 > int(axes_lens[0]):
        largest = (int(axes_lens[0]) - 2) // SEQ_MULTIPLE * SEQ_MULTIPLE
        raise ValueError(
            f"model.adapter_options.max_sequence_length={max_sequence_length}: past {what}, {axes_lens[0]} text positions "
            f"(the caption padded to {SEQ_MULTIPLE}, then the image); the largest valid value is {largest}"
        )

"""Wan2.1 / Wan2.2 text-to-video (`WanPipeline`): the adapter.

Loads the pipeline's components with diffusers' and transformers' `from_pretrained`: one or two
`WanTransformer3DModel` experts (trained, LoRA on the attention projections), the
`AutoencoderKLWan` video VAE and the UMT5 text encoder. Prompt encoding is the pipeline's own
`encode_prompt`, so embeddings (zero-padded to `model.adapter_options.max_sequence_length`) match diffusers.

Wan2.2 A14B has two experts: `transformer` denoises the high-noise steps (timestep >=
`boundary_ratio * num_train_timesteps`) and `transformer_2` the low-noise ones, each with its
own guidance scale (`model.adapter_options.guidance_scale_2` for the low-noise one). `predict_velocity`
routes every sample by its own sigma, so a packed batch whose samples sit on both sides of the
boundary is split, run through both experts and put back in order. TI2V-5B has one transformer and per-token timesteps (`expand_timesteps`).

Wan checkpoints ship a UniPC scheduler; the step kernels assume Euler sigmas, so the adapter
builds `FlowMatchEulerDiscreteScheduler(shift=flow_shift)` from the checkpoint's `flow_shift`.

Both experts train (LoRA on each): `trainable_modules` names them, and the base class handles
the rest (tensor names `transformer.` / `transformer_2.`, weight sync, checkpoints, FSDP2).

Its tiny models are in `adapters/tiny/wan.py`, its view for the planner in `adapters/plan/wan.py`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from omni_rl.option import option
from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter
from omni_rl.models.diffusion import PromptLengthOptions
from omni_rl.models.limits import check_positions


EXPERTS = ("transformer", "transformer_2")
# Weight file of the low-noise expert's LoRA, beside diffusers' default file for `transformer`.
LORA_2_WEIGHT_NAME = "pytorch_lora_weights_transformer_2.safetensors"


@dataclass
class WanOptions(PromptLengthOptions):
    """Wan2.2's options (`model.adapter_options`)."""

    guidance_scale_2: Optional[float] = option(None, "A14B: the CFG scale of the low-noise expert (diffusers' guidance_scale_2); null = rollout.sampling_options.guidance_scale. Rollout and training apply the same.")

    def check(self) -> None:
        super().check()
        value = self.guidance_scale_2
        if value is not None and not (math.isfinite(value) and value >= 1.0):
            raise ValueError(f"guidance_scale_2={value!r}: expected a finite CFG scale >= 1 (1 disables CFG), "
                             f"or null for rollout.sampling_options.guidance_scale")


@register_adapter("WanPipeline")
class WanAdapter(DiffusionModelBase):
    options_class = WanOptions
    # The Wan VAEs keep the first frame and compress every 4 after it; every Wan2.x transformer
    # patches 2x2 pixels of the latent (sizes: multiples of 8 x 2 for A14B, 16 x 2 for TI2V-5B,
    # which `latent_shape` checks from the checkpoint's VAE).
    frame_stride = 4
    size_multiple = 16
    # Self- (attn1) and cross-attention (attn2) projections of every block, as diffusers' Wan
    # LoRA examples target them (PEFT matches name suffixes).
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")
    # The VAE config as the planner reads it (`adapters/plan/wan.py`, which builds no VAE); None
    # in a built adapter, whose `vae.config` says the same.
    plan_vae: Optional[dict] = None

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
        from transformers import AutoTokenizer, UMT5EncoderModel

        super().__init__(cfg, path, device)
        root = Path(path)
        index = json.loads((root / "model_index.json").read_text())

        def load(cls, sub):
            return self.load_pretrained(cls, sub).to(device)

        def present(name):  # a null component is saved as [null, null]
            spec = index.get(name)
            return isinstance(spec, list) and all(spec) and (root / name).is_dir()

        self.transformer = load(WanTransformer3DModel, "transformer")
        self.transformer_2 = load(WanTransformer3DModel, "transformer_2") if present("transformer_2") else None
        self.vae = load(AutoencoderKLWan, "vae")
        self.text_encoder = load(UMT5EncoderModel, "text_encoder")
        self.scheduler = FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=self._scheduler_config(root).get("num_train_timesteps", 1000),
            shift=self._flow_shift(root),
        )
        boundary_ratio = index.get("boundary_ratio")
        if self.transformer_2 is not None and boundary_ratio is None:
            raise ValueError(f"{root / 'model_index.json'}: two experts but no boundary_ratio to route between them")
        self.pipeline = WanPipeline(
            tokenizer=AutoTokenizer.from_pretrained(path, subfolder="tokenizer"),
            text_encoder=self.text_encoder,
            vae=self.vae,
            scheduler=self.scheduler,
            transformer=self.transformer,
            transformer_2=self.transformer_2,
            boundary_ratio=boundary_ratio if self.transformer_2 is not None else None,
            expand_timesteps=bool(index.get("expand_timesteps", False)),
        )
        self.pipeline.set_progress_bar_config(disable=True)
        self.num_train_timesteps = self.scheduler.config.num_train_timesteps
        # Timesteps >= this go to `transformer` (high noise), below it to `transformer_2`.
        self.boundary_timestep = (
            boundary_ratio * self.num_train_timesteps if self.transformer_2 is not None else None
        )
        self.expand_timesteps = self.pipeline.config.expand_timesteps
        self.setup_trainable()

    @staticmethod
    def _scheduler_config(root: Path) -> dict:
        file = root / "scheduler" / "scheduler_config.json"
        return json.loads(file.read_text()) if file.is_file() else {}

    @classmethod
    def _flow_shift(cls, root: Path) -> float:
        """The checkpoint's shift: UniPC's `flow_shift`, or `shift` of a flow-match Euler config."""
        config = cls._scheduler_config(root)
        for key in ("flow_shift", "shift"):
            if config.get(key) is not None:
                return float(config[key])
        raise ValueError(
            f"{root / 'scheduler' / 'scheduler_config.json'} has neither `flow_shift` nor `shift`; the "
            f"Euler schedule needs the checkpoint's shift (Wan2.2: 5.0 at 720p, 3.0 at 480p)"
        )

    # --- what trains ---------------------------------------------------------------------
    def trainable_modules(self) -> dict[str, nn.Module]:
        """The experts by pipeline name: both for A14B, `transformer` alone for TI2V-5B / Wan2.1."""
        modules = {"transformer": self.transformer}
        if self.transformer_2 is not None:
            modules["transformer_2"] = self.transformer_2
        return modules

    def frozen_modules(self) -> list[nn.Module]:
        return [self.vae, self.text_encoder]

    def fsdp_wrap_classes(self):
        from diffusers.models.transformers.transformer_wan import WanTransformerBlock

        return (WanTransformerBlock,)

    # --- shapes --------------------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int = 1) -> tuple[int, ...]:
        """[z_dim, (num_frames - 1) // t + 1, height // s, width // s] for the VAE's temporal and
        spatial factors t, s; frames must be t*k + 1 and sizes multiples of s x patch size."""
        config = self.vae.config
        t, s = config.scale_factor_temporal, config.scale_factor_spatial
        if num_frames < 1 or (num_frames - 1) % t:
            low = max(0, (num_frames - 1) // t) * t + 1
            raise ValueError(
                f"num_frames={num_frames} is not {t}k+1 (the VAE compresses {t} frames into one after "
                f"the first); the nearest valid frame counts are {low} and {low + t}"
            )
        patch = self.transformer.config.patch_size
        for name, value, multiple in (("height", height, s * patch[1]), ("width", width, s * patch[2])):
            if value % multiple or value <= 0:
                low = max(multiple, value // multiple * multiple)
                valid = f"{low} and {low + multiple}" if low < value else f"{low}"
                raise ValueError(
                    f"{name}={value} px is not a multiple of {multiple} (VAE factor {s} x patch size "
                    f"{multiple // s}); the nearest valid values are {valid}"
                )
        _check_rope(height, width, num_frames, t, s, tuple(patch), self.transformer.config.rope_max_seq_len)
        return (config.z_dim, (num_frames - 1) // t + 1, height // s, width // s)

    @classmethod
    def check_model_limits(cls, cfg, configs) -> None:
        transformer, vae = configs.get("transformer"), configs.get("vae")
        if not transformer or not vae or transformer.get("rope_max_seq_len") is None:
            return
        r = cfg.rollout.sampling_options
        _check_rope(r.height, r.width, r.num_frames, int(vae.get("scale_factor_temporal", 4)),
                    int(vae.get("scale_factor_spatial", 8)), tuple(transformer.get("patch_size", (1, 2, 2))),
                    int(transformer["rope_max_seq_len"]))

    # --- conditioning and forward --------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        pos, neg = self.pipeline.encode_prompt(
            prompt=list(prompts),
            negative_prompt=[negative_prompt] * len(prompts),
            do_classifier_free_guidance=True,
            max_sequence_length=self.options.max_sequence_length,
            device=self.device,
        )
        return Conditioning({"prompt_embeds": pos, "negative_prompt_embeds": neg})

    def guidance_scale_2(self, guidance_scale: float) -> float:
        """The low-noise expert's scale: `model.adapter_options.guidance_scale_2` when set, else `guidance_scale`."""
        value = self.options.guidance_scale_2
        return guidance_scale if value is None else float(value)

    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        """Velocity with CFG for latents [B, C, T, H, W] at per-sample sigma [B], fp32.

        Each sample goes to the expert of its own timestep (sigma * num_train_timesteps):
        `transformer` at or above the boundary with `guidance_scale`, `transformer_2` below it
        with `guidance_scale_2`; the two groups' outputs are put back in the batch's order."""
        timestep = sigma.to(torch.float32).reshape(-1).to(self.device) * self.num_train_timesteps
        if timestep.shape[0] != latents.shape[0]:
            raise ValueError(f"sigma has {timestep.shape[0]} values for a batch of {latents.shape[0]} latents")
        if self.boundary_timestep is None:
            return self._guided(self.transformer, latents, timestep, conditioning, guidance_scale)
        high = timestep >= self.boundary_timestep
        if bool(high.all()) or not bool(high.any()):
            expert, scale = (
                (self.transformer, guidance_scale) if bool(high.all())
                else (self.transformer_2, self.guidance_scale_2(guidance_scale))
            )
            return self._guided(expert, latents, timestep, conditioning, scale)
        out = torch.empty(latents.shape, dtype=torch.float32, device=self.device)
        for mask, expert, scale in (
            (high, self.transformer, guidance_scale),
            (~high, self.transformer_2, self.guidance_scale_2(guidance_scale)),
        ):
            idx = mask.nonzero().squeeze(1)
            out[idx] = self._guided(
                expert, latents[idx.to(latents.device)], timestep[idx], conditioning.select(idx.cpu()), scale
            )
        return out

    def _guided(self, expert, latents, timestep, conditioning, guidance_scale) -> torch.Tensor:
        """One expert's forward with CFG `v_u + g (v_c - v_u)`: one pass over [uncond; cond]."""
        x = latents.to(self.device, self.dtype)
        cond = conditioning.to(self.device)
        if self.expand_timesteps:
            # TI2V-5B: one timestep per latent token (all equal for text-to-video), as the pipeline.
            p_t, p_h, p_w = expert.config.patch_size
            tokens = (x.shape[2] // p_t) * (x.shape[3] // p_h) * (x.shape[4] // p_w)
            timestep = timestep[:, None].expand(-1, tokens)
        embeds = cond["prompt_embeds"].to(self.dtype)
        if guidance_scale > 1.0:
            out = expert(
                hidden_states=torch.cat([x, x]),
                timestep=torch.cat([timestep, timestep]),
                encoder_hidden_states=torch.cat([cond["negative_prompt_embeds"].to(self.dtype), embeds]),
                return_dict=False,
            )[0].to(torch.float32)
            uncond, text = out.chunk(2)
            return uncond + guidance_scale * (text - uncond)
        out = expert(hidden_states=x, timestep=timestep, encoder_hidden_states=embeds, return_dict=False)[0]
        return out.to(torch.float32)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [B, C, T, H, W] -> uint8 video [B, T, H, W, 3]."""
        config = self.vae.config
        z = latents.to(self.device, self.vae.dtype)
        shape = (1, config.z_dim, 1, 1, 1)
        mean = torch.tensor(config.latents_mean, device=z.device, dtype=z.dtype).view(shape)
        std = torch.tensor(config.latents_std, device=z.device, dtype=z.dtype).view(shape)
        # The pipeline's un-normalisation: latents / (1 / std) + mean.
        video = self.vae.decode(z / (1.0 / std) + mean, return_dict=False)[0]
        video = (video.float() / 2 + 0.5).clamp(0, 1)
        return (video * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).cpu()

    # --- saving --------------------------------------------------------------------------
    def save_lora(self, folder: str) -> None:
        """diffusers' LoRA format, one file per expert, each with its adapter config (rank,
        alpha, targets) in the file's metadata. Load both into a `WanPipeline` with

            pipe.load_lora_weights(folder)                       # transformer
            pipe.load_lora_weights(folder, weight_name="pytorch_lora_weights_transformer_2.safetensors",
                                   load_into_transformer_2=True)  # transformer_2 (A14B only)

        (diffusers' Wan loader reads `transformer.`-prefixed keys into whichever expert
        `load_into_transformer_2` names, so each expert has a file of its own.)"""
        from diffusers import WanPipeline
        from peft.utils import get_peft_model_state_dict

        for name, module in self.trainable_modules().items():
            WanPipeline.save_lora_weights(
                folder,
                transformer_lora_layers=get_peft_model_state_dict(module),
                transformer_lora_adapter_metadata=module.peft_config["default"].to_dict(),
                weight_name=LORA_2_WEIGHT_NAME if name == "transformer_2" else None,
            )


def _check_rope(height: int, width: int, num_frames: int, t: int, s: int, patch: tuple, rope_max_seq_len: int) -> None:
    """Frames, rows and columns within the rotary table: `rope_max_seq_len` positions each, a
    position being p_t latent frames (t video frames each, the first alone) or p x s pixels."""
    what = "WanPipeline's rotary position table (its transformer's rope_max_seq_len)"
    check_positions("rollout.sampling_options.num_frames", num_frames, t * patch[0], rope_max_seq_len, what, "frames", offset=1 - t)
    check_positions("rollout.sampling_options.height", height, s * patch[1], rope_max_seq_len, what)
    check_positions("rollout.sampling_options.width", width, s * patch[2], rope_max_seq_len, what)

"""LTX-2 / LTX-2.3 audio-video generation (`LTX2Pipeline`): the adapter.

One `LTX2VideoTransformer3DModel` forward denoises a video latent and an audio latent together
(each stream attends to the other), so the adapter hands the engine `LatentStreams`:

    "video": [C, T', H', W']  T' = (num_frames - 1) // 8 + 1, H' = height // 32, W' = width // 32
    "audio": [C_a, L, M']     L = round(num_frames / frame_rate * sample_rate / hop / 4),
                              M' = mel_bins // 4

both in the space the pipeline denoises in: the video latent normalised per channel
((z - mean) * scaling / std) and the audio latent normalised per packed feature (channel x mel
bin), so a standard-normal draw is the pipeline's initial noise. `decode` / `decode_audio`
un-normalise before the VAEs, as the pipeline does after its loop.

The pieces, all loaded with `self.load_pretrained`: the Gemma text encoder (every hidden layer,
stacked, as the pipeline feeds it to the connectors), `LTX2TextConnectors` (one embedding per
stream, padded by the tokenizer to `model.adapter_options.max_sequence_length` exactly as the pipeline pads
it; with learnable registers the padding is replaced inside the connector, so the embeddings
have a fixed length and no mask travels with them), the transformer (trained, LoRA on its
attention projections), the video VAE, the audio VAE (latent -> mel spectrogram) and the
vocoder (mel -> waveform; LTX-2.3's `LTX2VocoderWithBWE` adds bandwidth extension).

Guidance is the pipeline's, computed as it computes it: in x0 space (x0 = x - sigma v) as
`x0_c + (g - 1)(x0_c - x0_u)`, plus the optional terms of LTX-2's call, each off by default:
spatio-temporal guidance (`model.adapter_options.stg_scale`, `stg_blocks`: `+ s (x0_c - x0_stg)` for a forward
whose self-attention in those blocks is skipped) and modality isolation (`model.adapter_options.modality_scale`:
`+ (m - 1)(x0_c - x0_isolated)` for a forward without the audio<->video cross-attention); then
optionally rescaled (`guidance_rescale`) and turned back into a velocity, with each weight per
stream (`LTX2Options`). The STG rows share the CFG forward (the transformer takes a per-sample perturbation
mask); modality isolation is a per-forward switch, so it costs a second forward. Rollout and
training both call `predict_velocity`, so both guide the same way.

The schedule is the pipeline's: sigmas `linspace(1, 1/N, N)` shifted by `mu` of the video
token count (`schedule_mu`), through the checkpoint's `FlowMatchEulerDiscreteScheduler`.

The frame rate: the transformer's video positions and the audio length depend on it, but the
diffusion contract passes neither `latent_shape` nor `predict_velocity` the request's fps, so
the adapter uses `frame_rate` (24, LTX-2's rate), one value per adapter.

Its tiny models are in `adapters/tiny/ltx2.py`, its view for the planner in `adapters/plan/ltx2.py`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from omni_rl.algos.latent_streams import LatentStreams
from omni_rl.option import option
from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter
from omni_rl.models.diffusion import PromptLengthOptions, check_frame_count, check_multiple, linspace_to_one_over_n

# The prompt conditioning: per stream, positive and negative (fixed length, see the module doc).
_EMBEDS = ("prompt_embeds", "audio_prompt_embeds", "prompt_mask")


@dataclass
class LTX2Options(PromptLengthOptions):
    """LTX-2's guidance terms (`model.adapter_options`), each one more transformer forward per step and
    all off by default (plain CFG). Rollout and training apply the same."""

    audio_guidance_scale: Optional[float] = option(None, "CFG scale of the audio stream; null = rollout.sampling_options.guidance_scale (LTX-2.3 suggests 7 with 3 for video).")
    guidance_rescale: float = option(0.0, "Guidance rescale factor phi of the video stream (0 = plain CFG).")
    audio_guidance_rescale: Optional[float] = option(None, "Guidance rescale factor of the audio stream; null = guidance_rescale.")
    stg_scale: float = option(0.0, "Spatio-temporal guidance (STG, arXiv 2411.18664) scale of the video stream: x0 moves away from a forward whose self-attention in stg_blocks is skipped (0 = off).")
    audio_stg_scale: Optional[float] = option(None, "STG scale of the audio stream; null = stg_scale (0 turns it off for audio alone).")
    stg_blocks: list[int] = option([], "Zero-based transformer block indices whose self-attention STG perturbs; required when a STG scale is > 0 (LTX-2.3: [28], LTX-2.0: [29]).")
    modality_scale: float = option(1.0, "Modality-isolation guidance scale of the video stream: x0 moves away from a forward without the audio<->video cross-attention (1 = off).")
    audio_modality_scale: Optional[float] = option(None, "Modality-isolation scale of the audio stream; null = modality_scale.")

    def check(self) -> None:
        super().check()
        for name, low, off in [("guidance_rescale", 0.0, "0 = off"), ("audio_guidance_rescale", 0.0, "0 = off"),
                               ("stg_scale", 0.0, "0 = off"), ("audio_stg_scale", 0.0, "0 = off"),
                               ("modality_scale", 1.0, "1 = off"), ("audio_modality_scale", 1.0, "1 = off")]:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= low):
                raise ValueError(f"{name}={value!r}: expected a finite value >= {low:g} ({off})")
        if not all(b >= 0 for b in self.stg_blocks):
            raise ValueError(f"stg_blocks={list(self.stg_blocks)}: expected zero-based transformer block indices "
                             f"(integers >= 0)")
        audio_stg = self.stg_scale if self.audio_stg_scale is None else self.audio_stg_scale
        if (self.stg_scale > 0 or audio_stg > 0) and not self.stg_blocks:
            raise ValueError(
                f"stg_blocks={list(self.stg_blocks)}: expected the block indices STG perturbs (LTX-2.3's pipeline "
                f"examples use [28], LTX-2.0's [29]) when model.adapter_options.stg_scale > 0 or model.adapter_options.audio_stg_scale > 0"
            )


@register_adapter("LTX2Pipeline")
class LTX2Adapter(DiffusionModelBase):
    options_class = LTX2Options

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.rollout.sampling_options.fps != cls.frame_rate:
            raise ValueError(
                f"rollout.sampling_options.fps={cfg.rollout.sampling_options.fps}: expected {cls.frame_rate:g} with {cfg.model.adapter} (its audio length "
                f"and video positions are computed at {cls.frame_rate:g} fps); set rollout.sampling_options.fps={cls.frame_rate:g}"
            )

    makes_audio = True
    frame_stride = 8  # the video VAE's temporal factor: frames are 8k + 1
    size_multiple = 32  # the video VAE's spatial factor (x patch size 1)
    # Frames per second the adapter generates for (see the module docstring).
    frame_rate: float = 24.0
    # Attention projections of every attention in the transformer blocks: video and audio self-
    # and text cross-attention and the audio<->video cross-attentions (PEFT matches suffixes).
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        import transformers
        from diffusers import (
            AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, LTX2Pipeline,
            LTX2VideoTransformer3DModel,
        )
        from diffusers.pipelines.ltx2 import LTX2TextConnectors
        from diffusers.pipelines.ltx2 import vocoder as vocoders
        from transformers import AutoTokenizer

        super().__init__(cfg, path, device)
        root = Path(path)
        index = json.loads((root / "model_index.json").read_text())

        def load(cls, sub):
            return self.load_pretrained(cls, sub).to(device)

        def library_class(name, module):  # the class model_index.json names for a component
            return getattr(module, index[name][1])

        self.transformer = load(LTX2VideoTransformer3DModel, "transformer")
        self.vae = load(AutoencoderKLLTX2Video, "vae")
        self.audio_vae = load(AutoencoderKLLTX2Audio, "audio_vae")
        self.text_encoder = load(library_class("text_encoder", transformers), "text_encoder")
        self.connectors = load(LTX2TextConnectors, "connectors")
        self.vocoder = load(library_class("vocoder", vocoders), "vocoder")
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler")
        self.pipeline = LTX2Pipeline(
            scheduler=self.scheduler, vae=self.vae, audio_vae=self.audio_vae, text_encoder=self.text_encoder,
            tokenizer=AutoTokenizer.from_pretrained(path, subfolder="tokenizer"), connectors=self.connectors,
            transformer=self.transformer, vocoder=self.vocoder,
        )
        self.pipeline.set_progress_bar_config(disable=True)
        self.num_train_timesteps = self.scheduler.config.num_train_timesteps
        self._check_stg()
        self.setup_trainable()

    # --- what trains ---------------------------------------------------------------------
    def trainable_module(self) -> nn.Module:
        return self.transformer

    def frozen_modules(self) -> list[nn.Module]:
        return [self.vae, self.audio_vae, self.text_encoder, self.connectors, self.vocoder]

    def fsdp_wrap_classes(self):
        from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformerBlock

        return (LTX2VideoTransformerBlock,)

    # --- shapes and schedule -------------------------------------------------------------
    def _video_grid(self, height: int, width: int, num_frames: int) -> tuple[int, int, int]:
        t, s = self.vae.temporal_compression_ratio, self.vae.spatial_compression_ratio
        p, p_t = self.transformer.config.patch_size, self.transformer.config.patch_size_t
        check_frame_count("rollout.sampling_options.num_frames", num_frames, t * p_t)
        check_multiple("rollout.sampling_options.height", height, s * p, f"video VAE factor {s} x patch size {p}")
        check_multiple("rollout.sampling_options.width", width, s * p, f"video VAE factor {s} x patch size {p}")
        return (num_frames - 1) // t + 1, height // s, width // s

    def audio_length(self, num_frames: int) -> int:
        """Audio latent frames for `num_frames` video frames at `frame_rate`, as the pipeline rounds it."""
        config = self.audio_vae.config
        per_second = config.sample_rate / config.mel_hop_length / float(self.audio_vae.temporal_compression_ratio)
        return round(num_frames / self.frame_rate * per_second)

    def latent_shape(self, height: int, width: int, num_frames: int = 1) -> dict[str, tuple[int, ...]]:
        """{"video": (C, T', H', W'), "audio": (C_a, L, M')} of one sample; frames must be 8k+1 and
        sizes multiples of 32 (for LTX-2's VAE), else `ValueError` names the nearest valid values."""
        frames, h, w = self._video_grid(height, width, num_frames)
        audio = self.audio_vae.config
        mel = audio.mel_bins // self.audio_vae.mel_compression_ratio
        return {
            "video": (self.transformer.config.in_channels, frames, h, w),
            "audio": (audio.latent_channels, self.audio_length(num_frames), mel),
        }

    def schedule_mu(self, height: int, width: int, num_frames: int = 1) -> float:
        """The pipeline's shift: `calculate_shift` of the packed video token count."""
        from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

        frames, h, w = self._video_grid(height, width, num_frames)
        p, p_t = self.transformer.config.patch_size, self.transformer.config.patch_size_t
        config = self.scheduler.config
        return float(calculate_shift(
            (frames // p_t) * (h // p) * (w // p),
            config.get("base_image_seq_len", 1024), config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.95), config.get("max_shift", 2.05),
        ))

    def base_sigmas(self, num_steps: int) -> list[float]:
        """The pipeline's unshifted spacing, `linspace(1, 1/N, N)` (the scheduler's own ends at
        1/1000); the base class shifts it by `schedule_mu` of the geometry."""
        return linspace_to_one_over_n(num_steps)

    # --- conditioning --------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        """Gemma's stacked hidden states of each prompt (padded on the left to
        `model.adapter_options.max_sequence_length` tokens) through the connectors: one embedding per stream."""
        pos, pos_mask, neg, neg_mask = self.pipeline.encode_prompt(
            prompt=list(prompts), negative_prompt=[negative_prompt] * len(prompts), do_classifier_free_guidance=True,
            max_sequence_length=self.options.max_sequence_length, device=self.device,
        )
        side = getattr(self.pipeline.tokenizer, "padding_side", "left")
        tensors = {}
        for prefix, embeds, mask in (("", pos, pos_mask), ("negative_", neg, neg_mask)):
            video, audio, connector_mask = self.connectors(embeds, mask, padding_side=side)
            for name, value in zip(_EMBEDS, (video, audio, connector_mask)):
                tensors[prefix + name] = value
        return Conditioning(tensors)

    # --- forward -------------------------------------------------------------------------
    def guidance(self, guidance_scale: float) -> dict[str, StreamGuidance]:
        """Each stream's guidance terms, the pipeline's per-modality values: an audio value of
        null takes the video one (`model.adapter_options.audio_guidance_scale`: LTX-2.3 suggests 7 with 3
        for video; `rollout.sampling_options.guidance_scale` is the video CFG scale)."""
        m = self.options

        def audio(value, video):
            return float(video if value is None else value)

        video = StreamGuidance(cfg=float(guidance_scale), stg=float(m.stg_scale), modality=float(m.modality_scale),
                               rescale=float(m.guidance_rescale))
        return {"video": video, "audio": StreamGuidance(
            cfg=audio(m.audio_guidance_scale, video.cfg), stg=audio(m.audio_stg_scale, video.stg),
            modality=audio(m.audio_modality_scale, video.modality), rescale=audio(m.audio_guidance_rescale, video.rescale),
        )}

    def _check_stg(self) -> None:
        """STG's blocks exist and perturb: with `perturbed_attn` off in the checkpoint's
        transformer the blocks ignore the perturbation and the STG term would be silently 0."""
        terms = self.guidance(1.0)
        if not (terms["video"].stg > 0 or terms["audio"].stg > 0):
            return
        layers = self.transformer.config.num_layers
        bad = [b for b in self.options.stg_blocks if not 0 <= b < layers]
        if bad:
            raise ValueError(f"model.adapter_options.stg_blocks={list(self.options.stg_blocks)}: {bad} are not blocks of this "
                             f"transformer (0 .. {layers - 1})")
        if not self.transformer.config.perturbed_attn:
            raise ValueError(
                "model.adapter_options.stg_scale > 0: this transformer's config has perturbed_attn=false, so its blocks "
                "cannot skip self-attention and STG would change nothing; set model.adapter_options.stg_scale=0 and "
                "model.adapter_options.audio_stg_scale=null (or use a checkpoint converted with perturbed_attn=true, as LTX-2.3's is)"
            )

    def predict_velocity(self, latents: LatentStreams, sigma, conditioning, guidance_scale) -> LatentStreams:
        """Velocities of both streams (fp32) at per-sample sigma [B], guided as the pipeline
        guides (module docstring). One forward over [uncond; cond; cond with STG] (the STG rows
        marked by a per-sample perturbation mask), and with modality isolation a second forward
        of the cond rows with the audio<->video cross-attention off (a per-forward switch)."""
        from diffusers import LTX2Pipeline

        video, audio = latents["video"], latents["audio"]
        batch, _, frames, height, width = video.shape
        sigma = sigma.to(torch.float32).reshape(-1).to(self.device)
        if sigma.shape[0] != batch:
            raise ValueError(f"sigma has {sigma.shape[0]} values for a batch of {batch} latents")
        p, p_t = self.transformer.config.patch_size, self.transformer.config.patch_size_t
        x = LTX2Pipeline._pack_latents(video.to(self.device, torch.float32), p, p_t)
        a = LTX2Pipeline._pack_audio_latents(audio.to(self.device, torch.float32))
        cond = conditioning.to(self.device)
        terms = self.guidance(guidance_scale)
        # The pipeline runs a term's forward when either stream uses it; a stream at its off value
        # then adds an exact zero.
        use_cfg, use_stg, use_modality = (any(test(t) for t in terms.values()) for test in (
            lambda t: t.cfg > 1.0, lambda t: t.stg > 0.0, lambda t: t.modality > 1.0))
        rows = (["uncond"] if use_cfg else []) + ["cond"] + (["stg"] if use_stg else [])
        prefix = {"uncond": "negative_", "cond": "", "stg": ""}
        text = {name: torch.cat([cond[prefix[row] + name] for row in rows]) for name in _EMBEDS}
        mask = None
        if use_stg:  # 1 = attend as usual, 0 = the STG rows' perturbed self-attention (lerp-exact at 0 and 1)
            mask = torch.cat([torch.full((batch,), float(row != "stg"), device=self.device) for row in rows])
        outputs = self._forward(x, a, sigma, text, len(rows), (frames, height, width),
                                stg_blocks=list(self.options.stg_blocks) if use_stg else None, perturbation_mask=mask)
        out = {name: dict(zip(rows, v.float().chunk(len(rows)))) for name, v in zip(("video", "audio"), outputs)}
        if use_modality:
            cond_text = {name: cond[name] for name in _EMBEDS}
            isolated = self._forward(x, a, sigma, cond_text, 1, (frames, height, width), isolate_modalities=True)
            for name, v in zip(("video", "audio"), isolated):
                out[name]["isolated"] = v.float()
        v, va = out["video"]["cond"], out["audio"]["cond"]
        if use_cfg or use_stg or use_modality:
            v = _guide_in_x0_space(x, sigma, out["video"], terms["video"])
            va = _guide_in_x0_space(a, sigma, out["audio"], terms["audio"])
        return LatentStreams({
            "video": LTX2Pipeline._unpack_latents(v, frames, height, width, p, p_t),
            "audio": LTX2Pipeline._unpack_audio_latents(va, audio.shape[2], num_mel_bins=audio.shape[3]),
        })

    def _forward(self, x, a, sigma, text, copies: int, grid, stg_blocks=None, perturbation_mask=None,
                 isolate_modalities: bool = False):
        """One transformer forward of `copies` stacked copies of the packed latents x [B, S, D],
        a [B, L, D_a] at sigma [B], with `text` holding [copies * B] rows: (video, audio) outputs."""
        frames, height, width = grid
        batch, length = x.shape[0], a.shape[1]
        timestep = torch.cat([sigma * self.num_train_timesteps] * copies)
        video_coords = self.transformer.rope.prepare_video_coords(
            batch * copies, frames, height, width, self.device, fps=self.frame_rate
        )
        audio_coords = self.transformer.audio_rope.prepare_audio_coords(batch * copies, length, self.device)
        if perturbation_mask is not None:
            perturbation_mask = perturbation_mask.to(self.dtype)
        return self.transformer(
            hidden_states=torch.cat([x] * copies).to(self.dtype),
            audio_hidden_states=torch.cat([a] * copies).to(self.dtype),
            encoder_hidden_states=text["prompt_embeds"].to(self.dtype),
            audio_encoder_hidden_states=text["audio_prompt_embeds"].to(self.dtype),
            timestep=timestep, sigma=timestep,
            encoder_attention_mask=text["prompt_mask"], audio_encoder_attention_mask=text["prompt_mask"],
            num_frames=frames, height=height, width=width, fps=self.frame_rate, audio_num_frames=length,
            video_coords=video_coords, audio_coords=audio_coords, use_cross_timestep=True,
            isolate_modalities=isolate_modalities, spatio_temporal_guidance_blocks=stg_blocks,
            perturbation_mask=perturbation_mask, return_dict=False,
        )

    # --- decoding ------------------------------------------------------------------------
    def _raw_video(self, latents) -> torch.Tensor:
        """The normalised video stream -> the VAE's latent space (the pipeline's `_denormalize_latents`)."""
        from diffusers import LTX2Pipeline

        z = latents["video"].to(self.device, torch.float32)
        vae = self.vae
        return LTX2Pipeline._denormalize_latents(z, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)

    def _raw_audio(self, latents) -> torch.Tensor:
        """The normalised audio stream -> the audio VAE's latents [B, C_a, L, M'] (stats per packed feature)."""
        from diffusers import LTX2Pipeline

        a = latents["audio"].to(self.device, torch.float32)
        packed = LTX2Pipeline._pack_audio_latents(a)
        packed = LTX2Pipeline._denormalize_audio_latents(packed, self.audio_vae.latents_mean, self.audio_vae.latents_std)
        return LTX2Pipeline._unpack_audio_latents(packed, a.shape[2], num_mel_bins=a.shape[3])

    @torch.no_grad()
    def decode(self, latents) -> torch.Tensor:
        """Latents -> uint8 video [B, T, H, W, 3] (a VAE with timestep conditioning decodes at
        timestep 0 without added noise, the pipeline's default `decode_timestep`)."""
        z = self._raw_video(latents).to(self.vae.dtype)
        timestep = None
        if self.vae.config.timestep_conditioning:
            timestep = torch.zeros(z.shape[0], device=z.device, dtype=z.dtype)
        video = self.vae.decode(z, timestep, return_dict=False)[0]
        video = (video.float() / 2 + 0.5).clamp(0, 1)
        return (video * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).cpu()

    @torch.no_grad()
    def decode_audio(self, latents) -> tuple[torch.Tensor, int]:
        """Latents -> (waveform float32 [B, channels, samples] in [-1, 1], sample rate): audio VAE
        -> mel spectrogram -> vocoder, as the pipeline does."""
        mel = self.audio_vae.decode(self._raw_audio(latents).to(self.audio_vae.dtype), return_dict=False)[0]
        wave = self.vocoder(mel.to(self.vocoder.dtype))
        return wave.float().clamp(-1, 1).cpu(), int(self.vocoder.config.output_sampling_rate)

    # --- saving --------------------------------------------------------------------------
    def save_lora(self, folder: str) -> None:
        """diffusers' LoRA format with the adapter config (rank, alpha, targets) in the file's
        metadata: `LTX2Pipeline.load_lora_weights(folder)` loads it at the trained scale."""
        from diffusers import LTX2Pipeline
        from peft.utils import get_peft_model_state_dict

        LTX2Pipeline.save_lora_weights(
            folder, transformer_lora_layers=get_peft_model_state_dict(self.transformer),
            transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
        )


@dataclass(frozen=True)
class StreamGuidance:
    """One stream's guidance weights; each at its default adds nothing."""

    cfg: float = 1.0  # g: + (g - 1)(x0_c - x0_u)
    stg: float = 0.0  # s: + s (x0_c - x0_stg)
    modality: float = 1.0  # m: + (m - 1)(x0_c - x0_isolated)
    rescale: float = 0.0  # phi: toward x0_c's std (Lin et al. 2023, eq. 16)


def _guide_in_x0_space(x, sigma, v: dict[str, torch.Tensor], terms: StreamGuidance) -> torch.Tensor:
    """The pipeline's guidance of packed latents x [B, S, D] from the velocities `v` of the
    forwards that ran ("cond", and "uncond" / "stg" / "isolated"): in x0 space (x0 = x - sigma v,
    each sample's own sigma)

        x0 = x0_c + (g - 1)(x0_c - x0_u) + s (x0_c - x0_stg) + (m - 1)(x0_c - x0_isolated),

    summed in that order, rescaled toward x0_c's std per sample when phi > 0, then back to a velocity."""
    s = sigma.view(-1, 1, 1)
    x0_c = x - v["cond"] * s
    x0 = x0_c
    for row, weight in (("uncond", terms.cfg - 1.0), ("stg", terms.stg), ("isolated", terms.modality - 1.0)):
        if row in v:
            x0 = x0 + weight * (x0_c - (x - v[row] * s))
    if terms.rescale > 0:
        std_c = x0_c.std(dim=list(range(1, x0_c.ndim)), keepdim=True)
        std_g = x0.std(dim=list(range(1, x0.ndim)), keepdim=True)
        x0 = terms.rescale * (x0 * (std_c / std_g)) + (1 - terms.rescale) * x0
    return (x - x0) / s

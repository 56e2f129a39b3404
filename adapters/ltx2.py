"""LTX-2 / LTX-2.3 audio-video generation (`LTX2Pipeline`): the adapter and its tiny model.

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
stream, padded by the tokenizer to `model.options.max_sequence_length` exactly as the pipeline pads
it; with learnable registers the padding is replaced inside the connector, so the embeddings
have a fixed length and no mask travels with them), the transformer (trained, LoRA on its
attention projections), the video VAE, the audio VAE (latent -> mel spectrogram) and the
vocoder (mel -> waveform; LTX-2.3's `LTX2VocoderWithBWE` adds bandwidth extension).

Guidance is the pipeline's, computed as it computes it: in x0 space (x0 = x - sigma v) as
`x0_c + (g - 1)(x0_c - x0_u)`, plus the optional terms of LTX-2's call, each off by default:
spatio-temporal guidance (`model.options.stg_scale`, `stg_blocks`: `+ s (x0_c - x0_stg)` for a forward
whose self-attention in those blocks is skipped) and modality isolation (`model.options.modality_scale`:
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

`tiny:ltx2` builds a seeded random-weight LTX-2.3-style model (per-modality connectors, a
bandwidth-extending vocoder) whose video and audio decoders respond to their latents.
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
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter, register_tiny_model
from omni_rl.plan.spec import PlanSpec, register_plan_spec
from omni_rl.models.diffusion import PromptLengthOptions, check_frame_count, check_multiple, linspace_to_one_over_n

# The prompt conditioning: per stream, positive and negative (fixed length, see the module doc).
_EMBEDS = ("prompt_embeds", "audio_prompt_embeds", "prompt_mask")


@dataclass
class LTX2Options(PromptLengthOptions):
    """LTX-2's guidance terms (`model.options`), each one more transformer forward per step and
    all off by default (plain CFG). Rollout and training apply the same."""

    audio_guidance_scale: Optional[float] = option(None, "CFG scale of the audio stream; null = rollout.guidance_scale (LTX-2.3 suggests 7 with 3 for video).")
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
                f"examples use [28], LTX-2.0's [29]) when model.options.stg_scale > 0 or model.options.audio_stg_scale > 0"
            )


@register_adapter("LTX2Pipeline")
class LTX2Adapter(DiffusionModelBase):
    options_class = LTX2Options

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.rollout.fps != cls.frame_rate:
            raise ValueError(
                f"rollout.fps={cfg.rollout.fps}: expected {cls.frame_rate:g} with {cfg.model.adapter} (its audio length "
                f"and video positions are computed at {cls.frame_rate:g} fps); set rollout.fps={cls.frame_rate:g}"
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
        check_frame_count("rollout.num_frames", num_frames, t * p_t)
        check_multiple("rollout.height", height, s * p, f"video VAE factor {s} x patch size {p}")
        check_multiple("rollout.width", width, s * p, f"video VAE factor {s} x patch size {p}")
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
        `model.options.max_sequence_length` tokens) through the connectors: one embedding per stream."""
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
        null takes the video one (`model.options.audio_guidance_scale`: LTX-2.3 suggests 7 with 3
        for video; `rollout.guidance_scale` is the video CFG scale)."""
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
            raise ValueError(f"model.options.stg_blocks={list(self.options.stg_blocks)}: {bad} are not blocks of this "
                             f"transformer (0 .. {layers - 1})")
        if not self.transformer.config.perturbed_attn:
            raise ValueError(
                "model.options.stg_scale > 0: this transformer's config has perturbed_attn=false, so its blocks "
                "cannot skip self-attention and STG would change nothing; set model.options.stg_scale=0 and "
                "model.options.audio_stg_scale=null (or use a checkpoint converted with perturbed_attn=true, as LTX-2.3's is)"
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


# --- the tiny model -----------------------------------------------------------------------
def _tiny_tokenizer():
    """A Gemma tokenizer over bytes: Gemma's special tokens, then its 256 byte-fallback tokens
    (`<0x00>` ...), so every prompt tokenises (no merges, one token per byte) without a download."""
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}
    vocab.update({f"<0x{b:02X}>": 5 + b for b in range(256)})
    return GemmaTokenizer(vocab=vocab, merges=[], model_max_length=1024)


def _tiny_text_encoder(vocab_size: int) -> nn.Module:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config=dict(
            vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, max_position_embeddings=256, sliding_window=64, pad_token_id=0,
        ),
        vision_config=dict(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
            patch_size=14,
        ),
        mm_tokens_per_image=4, image_token_index=vocab_size - 1, boi_token_index=vocab_size - 2,
        eoi_token_index=vocab_size - 3,
    )
    return Gemma3ForConditionalGeneration(config)


def _pass_through(conv: nn.Module, copies: int = 1, tap: tuple[int, ...] | None = None, gain: float = 1.0) -> None:
    """Make a convolution copy input channel i to output channel i (`copies` stacked blocks of
    them: a depth-to-space upsampler's sub-positions) at kernel position `tap` (default: the
    centre), times `gain`; every other weight and the bias zero."""
    weight = conv.weight
    weight.zero_()
    if conv.bias is not None:
        conv.bias.zero_()
    tap = tuple(k // 2 for k in weight.shape[2:]) if tap is None else tap
    block = weight.shape[0] // copies
    for copy_ in range(copies):
        for i in range(min(block, weight.shape[1])):
            weight[(copy_ * block + i, i, *tap)] = gain


@torch.no_grad()
def _make_video_decoder_responsive(vae: nn.Module, gain: float = 0.5) -> None:
    """A deterministic video decoder whose brightness follows the latents (as `adapters/wan.py`
    does for Wan's): a random one normalises the latent's magnitude away.

    1. every resnet's second convolution is zero (each block is its shortcut), and each
       upsampler's convolution copies channel i into every sub-position of channel i (nearest
       upsampling; the upsamplers keep the channel count, `upsample_factor` 1);
    2. `conv_in` writes u = the mean over channels of the *normalised* latent
       ((z - mean) * scaling / std, the adapter's latent) into feature 0 and a constant 1 into feature 1;
    3. the last per-channel RMS norm gives feature 0 = sqrt(C) u / sqrt(1 + u^2), monotone in u,
       and `conv_out` sets every pixel channel to `gain * silu(feature 0)` (pixels in [-1, 1]).

    Latent 0 decodes to mid-grey, +0.5 to ~0.75 brightness (0..1 scale)."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx2 import LTX2VideoResnetBlock3d, LTX2VideoUpsampler3d

    decoder = vae.decoder
    # The decoder is not causal: the current frame is each kernel's middle time tap (1, 1, 1).
    for module in decoder.modules():
        if isinstance(module, LTX2VideoResnetBlock3d):
            module.conv2.conv.weight.zero_()
            module.conv2.conv.bias.zero_()
        elif isinstance(module, LTX2VideoUpsampler3d):
            s = module.stride
            conv = module.conv.conv
            conv.weight.zero_()
            conv.bias.zero_()
            channels = conv.weight.shape[1]
            for c in range(channels):  # output channel c * prod(stride) + k -> sub-position k of channel c
                for k in range(s[0] * s[1] * s[2]):
                    conv.weight[c * s[0] * s[1] * s[2] + k, c, 1, 1, 1] = 1.0
    channels = vae.config.latent_channels
    scale = vae.config.scaling_factor / vae.latents_std
    conv_in = decoder.conv_in.conv
    conv_in.weight.zero_()
    conv_in.bias.zero_()
    conv_in.weight[0, :, 1, 1, 1] = scale / channels
    conv_in.bias[0] = -(vae.latents_mean * scale).sum() / channels
    conv_in.bias[1] = 1.0
    conv_out = decoder.conv_out.conv
    conv_out.weight.zero_()
    conv_out.bias.zero_()
    conv_out.weight[:, 0, 1, 1, 1] = gain


@torch.no_grad()
def _make_audio_path_responsive(audio_vae: nn.Module, vocoder: nn.Module, gain: float = 1.0) -> None:
    """A deterministic audio VAE decoder and vocoder whose waveform follows the latents (a random
    vocoder's output does not move for a latent step: its input is normalised and mixed away).

    Audio VAE decoder, as the video one: resnets are their shortcuts, upsamplers (nearest x2, then
    a causal convolution) copy channels at the current frame (the causal kernel's last time tap);
    `conv_in` writes u = the mean latent channel into feature 0 and 1 into feature 1, the pixel
    norm gives sqrt(C) u / sqrt(1 + u^2) and `conv_out` writes `silu` of it into every mel bin.

    Vocoder (either kind): its residual blocks are identities, `conv_in` sums the mel bins into
    channel 0 (+1, so the leaky ReLUs see positive values), every transposed convolution repeats
    each sample `stride` times, and `conv_out` maps channel 0 to `tanh(gain (m - 1))` for the mean
    mel value m: the waveform is a smooth increasing function of the latent. With bandwidth
    extension the extender's output convolution is zero, so the output is the resampled waveform."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LTX2AudioResnetBlock, LTX2AudioUpsample
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, ResBlock

    decoder = audio_vae.decoder
    now = (2, 1)  # causal along time ("height"): the current frame is the last time tap
    for module in decoder.modules():
        if isinstance(module, LTX2AudioResnetBlock):
            module.conv2.conv.weight.zero_()
            module.conv2.conv.bias.zero_()
        elif isinstance(module, LTX2AudioUpsample):
            _pass_through(module.conv.conv, tap=now)
    conv_in = decoder.conv_in.conv
    conv_in.weight.zero_()
    conv_in.bias.zero_()
    conv_in.weight[0, :, 2, 1] = 1.0 / conv_in.weight.shape[1]
    conv_in.bias[1] = 1.0
    conv_out = decoder.conv_out.conv
    conv_out.weight.zero_()
    conv_out.bias.zero_()
    conv_out.weight[:, 0, 2, 1] = 1.0

    stages = [vocoder] if isinstance(vocoder, LTX2Vocoder) else [vocoder.vocoder]
    for stage in stages:
        for block in stage.modules():
            if isinstance(block, ResBlock):
                for conv in block.convs2:
                    conv.weight.zero_()
                    conv.bias.zero_()
        stage.conv_in.weight.zero_()
        stage.conv_in.bias.zero_()
        stage.conv_in.weight[0, :, 3] = 1.0 / stage.conv_in.weight.shape[1]
        stage.conv_in.bias[0] = 1.0
        for up in stage.upsamplers:
            stride, pad = up.stride[0], up.padding[0]
            up.weight.zero_()
            up.bias.zero_()
            up.weight[0, 0, pad : pad + stride] = 1.0  # output t * stride + j comes from input t
        stage.conv_out.weight.zero_()
        stage.conv_out.weight[:, 0, 3] = gain
        if stage.conv_out.bias is not None:
            stage.conv_out.bias.fill_(-gain)
    if not isinstance(vocoder, LTX2Vocoder):
        vocoder.bwe_generator.conv_out.weight.zero_()


@register_tiny_model("ltx2")
def build_tiny_ltx2(folder: Path) -> None:
    """A tiny seeded random-weight LTX-2.3: a 2-layer Gemma-3 text encoder with a byte
    vocabulary, per-modality connectors with learnable registers, a 2-block transformer, a video
    VAE with LTX-2's factors (8 frames, 32 px: 32x32 px and 9 frames give a [8, 2, 1, 1] latent),
    an audio VAE (16 kHz, hop 160, 8 mel bins: 9 frames at 24 fps give a [2, 9, 2] latent) and a
    vocoder with bandwidth extension (16 -> 32 kHz). The decoders respond to their latents
    (`_make_video_decoder_responsive`, `_make_audio_path_responsive`)."""
    from diffusers import (
        AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE

    torch.manual_seed(0)
    tokenizer = _tiny_tokenizer()
    text_encoder = _tiny_text_encoder(len(tokenizer) + 3)
    text = text_encoder.config.text_config
    connectors = LTX2TextConnectors(
        caption_channels=text.hidden_size, text_proj_in_factor=text.num_hidden_layers + 1,
        video_connector_num_attention_heads=2, video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=8, audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=4, audio_connector_num_layers=1, audio_connector_num_learnable_registers=8,
        connector_rope_base_seq_len=32, rope_double_precision=False, rope_type="split",
        per_modality_projections=True, video_hidden_dim=16, audio_hidden_dim=8,
    )
    transformer = LTX2VideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
        audio_cross_attention_dim=8, num_layers=2, caption_channels=16, rope_double_precision=False,
        rope_type="split", use_prompt_embeddings=False, cross_attn_mod=True, audio_cross_attn_mod=True,
        gated_attn=True, audio_gated_attn=True, perturbed_attn=True,  # as LTX-2.3's: its blocks can do STG
    )
    vae = AutoencoderKLLTX2Video(
        latent_channels=8, block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True, False),
        downsample_type=("spatiotemporal", "spatiotemporal", "spatiotemporal", "spatial"),
        decoder_block_out_channels=(8, 8, 8), decoder_layers_per_block=(1, 1, 1, 1),
        decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(False,) * 4,
        upsample_residual=(False, False, False), upsample_factor=(1, 1, 1), decoder_causal=False,
        decoder_spatial_padding_mode="zeros", patch_size=4, scaling_factor=1.0,
    )
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1, 1, 1), num_res_blocks=1, latent_channels=2, mel_bins=8,
        sample_rate=16000, mel_hop_length=160, resolution=32,
    )
    # Statistics that are not 0 / 1, so the tests see every (un)normalisation.
    with torch.no_grad():
        vae.latents_mean.copy_(torch.linspace(-0.2, 0.2, 8))
        vae.latents_std.copy_(torch.linspace(0.8, 1.2, 8))
        audio_vae.latents_mean.copy_(torch.linspace(-0.1, 0.1, 4))
        audio_vae.latents_std.copy_(torch.linspace(0.9, 1.1, 4))
    vocoder = LTX2VocoderWithBWE(
        in_channels=2 * 8, hidden_channels=16, out_channels=2, upsample_kernel_sizes=[8, 8, 20],
        upsample_factors=[4, 4, 10], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3]], act_fn="leaky_relu",
        antialias=False, final_act_fn=None, final_bias=True, bwe_in_channels=2 * 8, bwe_hidden_channels=16,
        bwe_out_channels=2, bwe_upsample_kernel_sizes=[8, 8, 20], bwe_upsample_factors=[4, 4, 10],
        bwe_resnet_kernel_sizes=[3], bwe_resnet_dilations=[[1, 3]], bwe_act_fn="leaky_relu", bwe_antialias=False,
        filter_length=128, hop_length=80, window_length=128, num_mel_channels=8, input_sampling_rate=16000,
        output_sampling_rate=32000,
    )
    _make_video_decoder_responsive(vae)
    _make_audio_path_responsive(audio_vae, vocoder)
    # LTX-2's schedule: shifted by the video token count, stretched to end at 0.1 before the final 0.
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05, base_image_seq_len=1024, max_image_seq_len=4096,
        shift_terminal=0.1, time_shift_type="exponential",
    )
    pipe = LTX2Pipeline(
        scheduler=scheduler, vae=vae, audio_vae=audio_vae, text_encoder=text_encoder, tokenizer=tokenizer,
        connectors=connectors, transformer=transformer, vocoder=vocoder,
    )
    pipe.save_pretrained(Path(folder))


# --- the planner's view (omni_rl.plan.spec) ---------------------------------------------------
def _plan_load_trained(adapter) -> None:
    """The transformer, and the two VAEs as meta skeletons: their configs give the latent grid
    (`latent_shape`); they are frozen, not trained, and their weights are not counted here."""
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel

    adapter.transformer = adapter.load_pretrained(LTX2VideoTransformer3DModel, "transformer")
    adapter.vae = adapter.load_pretrained(AutoencoderKLLTX2Video, "vae")
    adapter.audio_vae = adapter.load_pretrained(AutoencoderKLLTX2Audio, "audio_vae")


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    """`_forward`'s call at the recipe's geometry: the video and audio tokens of `latent_shape`, the
    connectors' text at `max_sequence_length` tokens per stream, and one row per guidance term the
    recipe turns on (uncond, cond, STG: `predict_velocity`'s `rows`). The modality-isolation
    forward, when on, is a second forward of the cond rows alone, smaller than this one."""
    from omni_rl.plan.spec import prompt_tokens
    from omni_rl.plan.steps import cfg_copies

    c, r = adapter.transformer.config, cfg.rollout
    adapter.options = cfg.model.options
    terms = adapter.guidance(r.guidance_scale).values()
    rows = 1 + any(t.cfg > 1.0 for t in terms) + any(t.stg > 0.0 for t in terms)
    rows_total = batch // cfg_copies(cfg) * rows
    shapes = adapter.latent_shape(r.height, r.width, r.num_frames)
    (_, frames, h, w), (channels, length, mel) = shapes["video"], shapes["audio"]
    tokens = prompt_tokens(cfg)
    video_dim, audio_dim = ((c.caption_channels, c.caption_channels) if c.use_prompt_embeddings else
                            (c.num_attention_heads * c.attention_head_dim, c.audio_num_attention_heads * c.audio_attention_head_dim))
    timestep = torch.empty(rows_total, dtype=torch.float32)
    return {"transformer": dict(
        hidden_states=torch.empty(rows_total, frames * h * w, c.in_channels, dtype=adapter.dtype),
        audio_hidden_states=torch.empty(rows_total, length, channels * mel, dtype=adapter.dtype),
        encoder_hidden_states=torch.empty(rows_total, tokens, video_dim, dtype=adapter.dtype),
        audio_encoder_hidden_states=torch.empty(rows_total, tokens, audio_dim, dtype=adapter.dtype),
        timestep=timestep, sigma=timestep,
        encoder_attention_mask=torch.ones(rows_total, tokens, dtype=torch.long),
        audio_encoder_attention_mask=torch.ones(rows_total, tokens, dtype=torch.long),
        num_frames=frames, height=h, width=w, fps=adapter.frame_rate, audio_num_frames=length,
        use_cross_timestep=True, return_dict=False,
    )}


def _plan_latent_numel(adapter, cfg) -> int:
    """Both streams of one sample's latent."""
    import math

    shapes = adapter.latent_shape(cfg.rollout.height, cfg.rollout.width, cfg.rollout.num_frames)
    return sum(math.prod(shape) for shape in shapes.values())


register_plan_spec("LTX2Pipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs, latent_numel=_plan_latent_numel))

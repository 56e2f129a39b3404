"""MiniMax-H3 text to audio + video (`MiniMaxH3ModularPipeline`, its `t2va` workflow): the adapter.

One `MiniMaxH3Transformer3DModel` forward runs over one packed sequence per sample, `[text |
audio | video]` rows (no cross-attention, no padding), and predicts a *data-ward* velocity of the
video and the audio rows (x0 = x + sigma v; the contract's velocity is its negative). The adapter
hands the engine `LatentStreams`:

    "video": [C, T', H', W']  T' = 5n + 2 for 17n + 5 frames, H' = height // 16, W' = width // 16
    "audio": [2, L, C_a]      the stereo channels' rows, channel-major as the pipeline packs them,
                              L = round(num_frames / 24 * 40)

both normalised as the pipeline denoises them (per-channel `latents_mean` / `latents_std`), so a
standard-normal draw is the pipeline's noise (video first, then audio, from one generator).

Two schedules, one kernel. The pipeline steps the video rows down a schedule of shift 12 and the
audio rows down one of shift 3, both `shift(linspace(1, 0, N))` (`MiniMaxH3Scheduler`, Euler with
eta 0). The step kernels step every stream at one sigma, the video's; the audio stream is carried
in a coordinate that makes that exact. Shifts compose (f_a = f_{a/v} o f_v) and scale the odds:
sigma_a / (1 - sigma_a) = (S_a / S_v) sigma_v / (1 - sigma_v). So y = (sigma_v / sigma_a) x_a is a
standard flow at time sigma_v between the noise and r x0_a, r = S_v / S_a (4 for the released
shifts): y = (1 - sigma_v) r x0_a + sigma_v eps. Euler with eta 0 is DDIM, which such a rescaling
leaves unchanged, so the kernels' deterministic step of y at the video's sigmas is the pipeline's
audio step, and their SDE steps are the same family's steps on y. y equals x_a at sigma 1 (the
initial noise is the pipeline's) and r x0_a at sigma 0 (`decode_audio` divides by r).
`predict_velocity` converts y to x_a at sigma_a = f_{a/v}(sigma_v), runs the transformer at
(1 - sigma_v, 1 - sigma_a), and returns y's velocity.

Guidance: none. The released checkpoint is guidance-distilled (the pipeline has no guider, no
negative prompt, one forward per step), so `rollout.sampling_options.guidance_scale` must be 1 (`check_config`).

Packing: the transformer's timesteps, row tags and positions are one per sequence, shared by the
batch, and its sequence has no mask. A packed forward therefore groups its samples by (sigma,
prompt length) and runs one batched forward per group: each sample sees exactly the sequence it
would see alone.

What is supported: text to audio + video (`t2va`) at 24 fps, 17n + 5 frames lasting 5 to 15 s,
sizes multiples of 32 (the pipeline's limits, refused at load). Left out: the `fl2va` (first /
last keyframe) and `ref2va` (image, video and audio references, the `transformer_ref/`
partition) workflows: both condition on media through extra packed rows pinned at their own
timesteps and a presentation with vision blocks, which the contract's text `Conditioning` does
not carry yet (`takes_source_image` would cover a first keyframe in a later slice).

Loading: each component from its subfolder of a checkpoint in diffusers' modular layout, as the
released repository is: a `modular_model_index.json` names the architecture and the components
(the project's model-folder check reads it, `omni_rl.models.loading.index_components`, as
`ModularPipeline.from_pretrained` does); a `model_index.json` is read too. Its tiny model is in
`adapters/tiny/minimax_h3.py`, its view for the planner in `adapters/plan/minimax_h3.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from omni_rl.algos.latent_streams import LatentStreams
from omni_rl.config.schema import ModelConfig
from omni_rl.device import runs_on_cpu
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter
from omni_rl.models.diffusion import PromptLengthOptions, check_multiple
from omni_rl.models.limits import check_sample_memory, check_step_memory

# The pipeline's constants (diffusers' modular_pipelines/minimax_h3/modular_pipeline.py): its
# frame rate, the durations it generates, the Qwen3-VL hidden state it conditions on, the audio
# latent rate and the stereo channels packed channel-major.
FPS = 24
MIN_SECONDS, MAX_SECONDS = 5.0, 15.0
TEXT_ENCODER_LAYER = 50
AUDIO_LATENTS_PER_SECOND = 40
AUDIO_CHANNELS = 2
# The released VAE's chunking: 17 frames per chunk, 5 latent frames each (17n + 5 -> 5n + 2).
FRAMES_PER_CHUNK, LATENTS_PER_CHUNK = 17, 5
# Row tags of the packed sequence (`MiniMaxH3ModularPipeline.video_tag` / `text_tag` / `audio_tag`).
VIDEO_TAG, TEXT_TAG, AUDIO_TAG = 0, 1, 2
# ImageNet's per-channel statistics: the video VAE decodes to RGB normalised by them.
PIXEL_MEAN, PIXEL_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def frame_limits(frames_per_chunk: int = FRAMES_PER_CHUNK, latents_per_chunk: int = LATENTS_PER_CHUNK):
    """The frame counts the model takes: `frames_per_chunk * n + latents_per_chunk` within
    MIN_SECONDS .. MAX_SECONDS at FPS (124 .. 345 for the released VAE)."""
    valid = [f for f in range(1, int(MAX_SECONDS * FPS) + 1)
             if f % frames_per_chunk == latents_per_chunk and f >= MIN_SECONDS * FPS]
    return valid


def check_num_frames(num_frames: int, frames_per_chunk: int = FRAMES_PER_CHUNK,
                     latents_per_chunk: int = LATENTS_PER_CHUNK) -> None:
    """`ValueError` naming `rollout.sampling_options.num_frames`, the form and the duration limits, with the nearest valid counts."""
    valid = frame_limits(frames_per_chunk, latents_per_chunk)
    if num_frames in valid:
        return
    near = sorted(valid, key=lambda f: (abs(f - num_frames), f))[:2]
    raise ValueError(
        f"rollout.sampling_options.num_frames={num_frames}: expected {frames_per_chunk}n+{latents_per_chunk} frames lasting "
        f"{MIN_SECONDS:g} to {MAX_SECONDS:g} s at {FPS} fps ({valid[0]} .. {valid[-1]}: what MiniMax-H3's video VAE "
        f"encodes and the durations it generates), e.g. {' or '.join(map(str, sorted(near)))}"
    )


def audio_sigma(sigma: torch.Tensor, video_shift: float, audio_shift: float) -> torch.Tensor:
    """sigma_a = f_{S_a / S_v}(sigma_v), f_s(x) = s x / (1 + (s - 1) x): the audio schedule's sigma
    at the video's (both shift the same unshifted grid), in float64."""
    s = audio_shift / video_shift
    x = sigma.to(torch.float64)
    return s * x / (1 + (s - 1) * x)


@dataclass
class MiniMaxH3Options(PromptLengthOptions):
    """`model.adapter_options`: `max_sequence_length` is the longest prompt, in tokens, the adapter takes.
    The pipeline never pads or cuts a prompt (its sequence has no mask), so a longer prompt is
    refused rather than cut; the planner traces at this length."""


@register_adapter("MiniMaxH3ModularPipeline")
class MiniMaxH3Adapter(DiffusionModelBase):
    options_class = MiniMaxH3Options
    makes_audio = True
    size_multiple = 32  # the video VAE's 16 px x the transformer's 2 x 2 patch
    # Every attention projection of the refiner and the block stack (one self-attention each).
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")

    @classmethod
    def check_config(cls, cfg) -> None:
        r = cfg.rollout.sampling_options
        check_num_frames(r.num_frames)
        check_multiple("rollout.sampling_options.height", r.height, cls.size_multiple, f"what {cfg.model.adapter} takes")
        check_multiple("rollout.sampling_options.width", r.width, cls.size_multiple, f"what {cfg.model.adapter} takes")
        if r.fps != FPS:
            raise ValueError(f"rollout.sampling_options.fps={r.fps}: expected {FPS} with {cfg.model.adapter} (it generates at a fixed "
                             f"{FPS} fps); set rollout.sampling_options.fps={FPS}")
        if r.guidance_scale != 1.0:
            raise ValueError(
                f"rollout.sampling_options.guidance_scale={r.guidance_scale}: expected 1.0 with {cfg.model.adapter} (the checkpoint is "
                f"guidance-distilled: one forward per step, no negative prompt); set rollout.sampling_options.guidance_scale=1.0"
            )
        if r.negative_prompt:
            raise ValueError(
                f"rollout.sampling_options.negative_prompt={r.negative_prompt!r}: {cfg.model.adapter} takes none (guidance-distilled: "
                f"no unconditional forward); set rollout.sampling_options.negative_prompt=''"
            )
        check_sample_memory(r.height, r.width, r.num_frames)
        check_step_memory(cfg, on_cpu=runs_on_cpu(cfg.trainer.device))

    @classmethod
    def check_model_limits(cls, cfg, configs) -> None:
        """The frame form and size multiple of this checkpoint's own VAE and patch (the released
        ones are what `check_config` checks): `clip_length` frames per chunk keeping
        ceil(clip_length / temporal factor) latent frames, sizes a multiple of spatial factor x patch."""
        vae, transformer = configs.get("vae"), configs.get("transformer")
        if not vae:
            return
        temporal = math.prod(vae.get("temporal_downsample_factors", (1, 2, 2, 1, 1, 1)))
        chunk = int(vae.get("clip_length", FRAMES_PER_CHUNK))
        check_num_frames(cfg.rollout.sampling_options.num_frames, chunk, math.ceil(chunk / temporal))
        spatial = math.prod(vae.get("spatial_downsample_factors", (2, 2, 2, 2, 1, 1)))
        patch = int((transformer or {}).get("patch_size", (1, 2, 2))[2])
        for key in ("height", "width"):
            check_multiple(f"rollout.sampling_options.{key}", getattr(cfg.rollout.sampling_options, key), spatial * patch,
                           f"video VAE factor {spatial} x patch size {patch}")

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        from diffusers import (
            AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel,
        )
        from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration, Qwen3VLProcessor

        super().__init__(cfg, path, device)

        def load(cls, sub):
            return self.load_pretrained(cls, sub).to(device)

        self.transformer = load(MiniMaxH3Transformer3DModel, "transformer")
        self.vae = load(AutoencoderKLMiniMaxH3, "vae")
        self.audio_vae = load(AutoencoderKLMiniMaxH3Audio, "audio_vae")
        self.text_encoder = load(Qwen3VLForConditionalGeneration, "text_encoder")
        self.tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer")
        self.processor = Qwen3VLProcessor.from_pretrained(path, subfolder="processor")
        self.scheduler = MiniMaxH3Scheduler.from_pretrained(path, subfolder="scheduler")
        self.audio_scheduler = MiniMaxH3Scheduler.from_pretrained(path, subfolder="audio_scheduler")
        self.setup_trainable()

    # --- what trains ---------------------------------------------------------------------
    def trainable_module(self) -> nn.Module:
        return self.transformer

    def frozen_modules(self) -> list[nn.Module]:
        return [self.vae, self.audio_vae, self.text_encoder]

    def fsdp_wrap_classes(self):
        from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3TransformerBlock

        return (MiniMaxH3TransformerBlock,)

    # --- shapes and schedule -------------------------------------------------------------
    @property
    def shifts(self) -> tuple[float, float]:
        """(video shift, audio shift) of the checkpoint's two schedulers."""
        return float(self.scheduler.config.shift), float(self.audio_scheduler.config.shift)

    def _video_grid(self, height: int, width: int, num_frames: int) -> tuple[int, int, int]:
        chunk, kept = self.vae.config.clip_length, self.vae.tokens_chunk_size
        check_num_frames(num_frames, chunk, kept)
        ratio = self.vae.spatial_compression_ratio
        multiple = ratio * self.transformer.config.patch_size[2]
        check_multiple("rollout.sampling_options.height", height, multiple, f"video VAE factor {ratio} x patch size 2")
        check_multiple("rollout.sampling_options.width", width, multiple, f"video VAE factor {ratio} x patch size 2")
        return (num_frames - kept) // chunk * kept + 2, height // ratio, width // ratio

    def latent_shape(self, height: int, width: int, num_frames: int = 1) -> dict[str, tuple[int, ...]]:
        frames, h, w = self._video_grid(height, width, num_frames)
        length = int(round(num_frames / FPS * AUDIO_LATENTS_PER_SECOND))
        return {
            "video": (self.vae.config.latent_channels, frames, h, w),
            "audio": (AUDIO_CHANNELS, length, self.audio_vae.config.latent_channels),
        }

    def sigmas(self, num_steps: int, height: int | None = None, width: int | None = None,
               num_frames: int = 1) -> torch.Tensor:
        """The video schedule of `num_steps` model evaluations: `MiniMaxH3Scheduler` with
        `num_steps + 1` grid points (its count includes the final 0), [num_steps + 1] fp32. The
        audio schedule follows from it (module docstring)."""
        cache = self.__dict__.setdefault("_sigma_cache", {})
        if num_steps not in cache:
            if num_steps < 1:
                raise ValueError(f"num_steps={num_steps}: expected at least 1 denoising step")
            grids = []
            for scheduler in (self.scheduler, self.audio_scheduler):
                scheduler = type(scheduler).from_config(scheduler.config)
                scheduler.set_timesteps(num_steps + 1, device="cpu")
                grids.append(scheduler.sigmas.to(torch.float32))
            if not all(len(g) == num_steps + 1 for g in grids):
                raise ValueError(
                    f"num_steps={num_steps}: the shifted grid collapses to {len(grids[0]) - 1} video / "
                    f"{len(grids[1]) - 1} audio steps in float32 (MiniMaxH3Scheduler merges equal sigmas); use fewer steps"
                )
            cache[num_steps] = grids[0]
        return cache[num_steps]

    # --- conditioning --------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        """Each prompt verbatim (no chat template, no special tokens) through Qwen3-VL, its hidden
        state after decoder layer 50, as the pipeline's `t2va` text encoder; right-padded to the
        longest with a mask. There is no negative prompt (guidance-distilled)."""
        from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds

        embeds = []
        for prompt in prompts:
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            if not ids:
                raise ValueError(f"prompt {prompt!r} has no tokens; MiniMax-H3 needs a non-empty prompt")
            if len(ids) > self.options.max_sequence_length:
                raise ValueError(
                    f"prompt {prompt[:40]!r}... has {len(ids)} tokens, more than model.adapter_options.max_sequence_length="
                    f"{self.options.max_sequence_length}; raise it (the pipeline encodes a prompt whole, never cut)"
                )
            embeds.append(get_qwen3vl_prompt_embeds(
                self.text_encoder, self.processor, ids, {}, text_encoder_layer=TEXT_ENCODER_LAYER, device=self.device,
                dtype=self.text_encoder.dtype,
            )[0])
        longest = max(e.shape[0] for e in embeds)
        padded = torch.zeros(len(embeds), longest, embeds[0].shape[-1], dtype=embeds[0].dtype, device=self.device)
        mask = torch.zeros(len(embeds), longest, dtype=torch.long, device=self.device)
        for i, e in enumerate(embeds):
            padded[i, : e.shape[0]] = e
            mask[i, : e.shape[0]] = 1
        return Conditioning({"prompt_embeds": padded, "prompt_embeds_mask": mask},
                            masks={"prompt_embeds": "prompt_embeds_mask"})

    # --- forward -------------------------------------------------------------------------
    def predict_velocity(self, latents: LatentStreams, sigma, conditioning, guidance_scale) -> LatentStreams:
        """Velocities (fp32, the contract's sign) of the video stream and of the audio stream's y
        coordinate (module docstring) at per-sample video sigma [B]; one transformer forward per
        group of samples sharing (sigma, prompt length)."""
        video, y = latents["video"].to(self.device, torch.float32), latents["audio"].to(self.device, torch.float32)
        batch = video.shape[0]
        sigma = sigma.to(torch.float32).reshape(-1).to(self.device)
        if sigma.shape[0] != batch:
            raise ValueError(f"sigma has {sigma.shape[0]} values for a batch of {batch} latents")
        if float(guidance_scale) != 1.0:
            raise ValueError(f"guidance_scale={guidance_scale}: MiniMax-H3 is guidance-distilled; expected 1.0")
        video_shift, audio_shift = self.shifts
        sigma_a = audio_sigma(sigma, video_shift, audio_shift)
        k = (sigma.to(torch.float64) / sigma_a).to(torch.float32)  # y = k x_a
        x_a = y / k.view(-1, 1, 1, 1)
        cond = conditioning.to(self.device)
        lengths = cond["prompt_embeds_mask"].sum(dim=1).tolist()
        sigma_list, sigma_a_list = sigma.tolist(), sigma_a.tolist()
        groups: dict[tuple, list[int]] = {}
        for i in range(batch):
            groups.setdefault((sigma_list[i], lengths[i]), []).append(i)
        v_video = torch.empty_like(video)
        v_audio = torch.empty_like(y)
        for (s, length), rows in groups.items():
            idx = torch.tensor(rows, device=self.device)
            text = cond["prompt_embeds"].index_select(0, idx)[:, :length]
            out_v, out_a = self._forward(video.index_select(0, idx), x_a.index_select(0, idx), text,
                                         1.0 - s, 1.0 - sigma_a_list[rows[0]])
            v_video[idx] = out_v
            v_audio[idx] = out_a
        # Video: the model's data-ward velocity is -v. Audio: x0_a = x_a + sigma_a v, then y's
        # velocity (y - r x0_a) / sigma_v.
        ratio = video_shift / audio_shift
        x0_a = x_a + sigma_a.to(torch.float32).view(-1, 1, 1, 1) * v_audio
        return LatentStreams({"video": -v_video, "audio": (y - ratio * x0_a) / sigma.view(-1, 1, 1, 1)})

    def _layout(self, text_length: int, grid: tuple[int, int, int], audio_length: int):
        """The pipeline's `t2va` packed layout (`MiniMaxH3PrepareLayoutStep.build_packed_sequence`)."""
        from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

        cache = self.__dict__.setdefault("_layout_cache", {})
        key = (text_length, grid, audio_length)
        if key not in cache:
            frames, h, w = grid
            position_ids, tags, video_idx, audio_idx, text_idx, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
                torch.full((text_length,), TEXT_TAG, dtype=torch.long), frames, h, w, audio_length,
                tuple(self.transformer.config.patch_size), AUDIO_CHANNELS, AUDIO_TAG, VIDEO_TAG,
            )
            # The transformer's rope casts to fp32; devices without fp64 (NPU, MPS) take fp32 here.
            dtype = torch.float64 if self.device.type in ("cpu", "cuda") else torch.float32
            cache[key] = dict(position_ids=position_ids.to(self.device, dtype), token_tags=tags.to(self.device),
                              video_indices=video_idx.to(self.device), audio_indices=audio_idx.to(self.device),
                              text_indices=text_idx.to(self.device))
        return cache[key]

    def _forward(self, video, x_a, text, t_video: float, t_audio: float):
        """One transformer forward of n samples at the same timesteps and prompt length: video
        [n, C, T, H, W], audio [n, 2, L, C_a], text [n, length, D] -> data-ward velocities in
        the latents' shapes (fp32)."""
        from diffusers.modular_pipelines.minimax_h3.before_denoise import (
            MiniMaxH3SetTimestepsStep, patchify_video_latents,
        )

        n, channels, frames, h, w = video.shape
        _, channels_a, length, latent_a = x_a.shape
        patch = tuple(self.transformer.config.patch_size)
        layout = self._layout(text.shape[1], (frames, h, w), length)
        timesteps, indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            layout["video_indices"].cpu(), layout["audio_indices"].cpu(), 0, 0, text.shape[1], t_video, t_audio,
            t_video, 1.0,
        )
        rows = patchify_video_latents(video, patch).reshape(n, -1, channels * math.prod(patch))
        v, a = self.transformer(
            hidden_states=rows.to(self.dtype), audio_hidden_states=x_a.reshape(n, channels_a * length, latent_a).to(self.dtype),
            encoder_hidden_states=text.to(self.dtype), timestep=timesteps.to(self.device),
            timestep_indices=indices.to(self.device), return_dict=False, **layout,
        )
        return _unpatchify(v.float(), (channels, frames, h, w), patch), a.float().reshape(x_a.shape)

    # --- decoding ------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, latents) -> torch.Tensor:
        """Latents -> uint8 video [B, T, H, W, 3]: un-normalised, decoded by the (tiled) VAE, mapped
        back from ImageNet-normalised RGB, as the pipeline's video decode step."""
        z = latents["video"].to(self.device, torch.float32)
        mean = torch.tensor(self.vae.config.latents_mean, device=z.device).view(1, -1, 1, 1, 1)
        std = torch.tensor(self.vae.config.latents_std, device=z.device).view(1, -1, 1, 1, 1)
        video = self.vae.decode((z * std + mean).to(self.vae.dtype), return_dict=False)[0].float()
        pixel_mean = torch.tensor(PIXEL_MEAN, device=z.device).view(1, -1, 1, 1, 1)
        pixel_std = torch.tensor(PIXEL_STD, device=z.device).view(1, -1, 1, 1, 1)
        video = (video * pixel_std + pixel_mean).clamp(0, 1)
        return (video * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).cpu()

    def audio_latents(self, latents) -> torch.Tensor:
        """The audio stream's clean y (= r x0_a at sigma 0) -> the pipeline's normalised audio
        latents [B, 2, C_a, L]."""
        video_shift, audio_shift = self.shifts
        return (latents["audio"].to(self.device, torch.float32) / (video_shift / audio_shift)).permute(0, 1, 3, 2)

    @torch.no_grad()
    def decode_audio(self, latents) -> tuple[torch.Tensor, int]:
        """Latents -> (stereo waveform float32 [B, 2, samples] in [-1, 1], sample rate): each channel
        un-normalised and decoded by the mono audio VAE, as the pipeline's audio decode step."""
        a = self.audio_latents(latents)
        batch, channels, latent_channels, length = a.shape
        mean = torch.tensor(self.audio_vae.config.latents_mean, device=a.device).view(1, -1, 1)
        std = torch.tensor(self.audio_vae.config.latents_std, device=a.device).view(1, -1, 1)
        flat = a.reshape(batch * channels, latent_channels, length) * std + mean
        wave = self.audio_vae.decode(flat.to(get_dtype(self.audio_vae)), return_dict=False)[0].float()
        return wave.reshape(batch, channels, -1).clamp(-1, 1).cpu(), int(self.audio_vae.config.sampling_rate)

    # --- saving --------------------------------------------------------------------------
    def save_lora(self, folder: str) -> None:
        """diffusers' LoRA format for the `transformer` partition, with the adapter config in the
        file's metadata: `MiniMaxH3ModularPipeline.load_lora_weights(folder)` loads it at the
        trained scale."""
        from diffusers import MiniMaxH3ModularPipeline
        from peft.utils import get_peft_model_state_dict

        MiniMaxH3ModularPipeline.save_lora_weights(
            folder, transformer_lora_layers=get_peft_model_state_dict(self.transformer),
            transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
        )


def get_dtype(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


def _unpatchify(rows: torch.Tensor, shape: tuple[int, int, int, int], patch: tuple[int, int, int]) -> torch.Tensor:
    """[n, rows, C * prod(patch)] (frame-major, then row-major) -> [n, C, T, H, W]: the inverse of
    `patchify_video_latents`, as the pipeline's after-denoise step unpacks."""
    channels, frames, h, w = shape
    pt, ph, pw = patch
    x = rows.reshape(rows.shape[0], frames // pt, h // ph, w // pw, channels, pt, ph, pw)
    return x.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(rows.shape[0], channels, frames, h, w)

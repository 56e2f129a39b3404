"""`DiffusionModelBase`: the contract of flow-matching generators (image, video, audio).

Rollout and trainer call the same methods: `sigmas(...)`, `encode_prompts(...)` (a
`Conditioning`; editing models, `takes_source_image`, also take condition images),
`predict_velocity(latents, sigma, conditioning, guidance_scale)` (guidance included, fp32) and
`decode(latents)` (`decode_audio` for models that `makes_audio`). Latents are shaped as
`latent_shape(height, width, num_frames)` says; nothing assumes images. docs/extending/adapter.md
walks through an adapter.
"""
from __future__ import annotations

import copy
from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np
import torch

from omni_rl.option import ComponentOptions, option
from omni_rl.models.base import OmniModelBase
from omni_rl.models.conditioning import Conditioning
from omni_rl.device import runs_on_cpu
from omni_rl.models.limits import check_sample_memory, check_step_memory


def nearest_multiples(value: int, factor: int) -> str:
    """The valid values around `value` for a size that must be a positive multiple of `factor`."""
    low = max(factor, value // factor * factor)
    return f"{low}" if low == value else f"{low} or {low + factor}" if low < value else f"{low}"


@dataclass
class PromptLengthOptions(ComponentOptions):
    """The option every adapter with a fixed-length prompt encoding shares (`model.adapter_options`); an
    adapter's own options class derives from it, and its `check()` calls this one's."""

    max_sequence_length: int = option(256, "Prompt tokens of the text encoder (diffusers' max_sequence_length): prompts are padded or cut to it. Without a T5 encoder (SD3) these are zero padding, so tiny models use a short one.")

    def check(self) -> None:
        if not (isinstance(self.max_sequence_length, int) and self.max_sequence_length >= 1):
            raise ValueError(f"max_sequence_length={self.max_sequence_length!r}: expected an integer >= 1")


@dataclass
class EditingOptions(PromptLengthOptions):
    """The option editing adapters share (`model.adapter_options`); an adapter's own options class
    derives from it to add its knobs."""

    condition_image_size: Optional[list[int]] = option(None, "[height, width] in px the source image is resized to and encoded at (through the VAE and the vision-language encoder); null = the output's size (rollout.sampling_options.height, rollout.sampling_options.width). Rollout and training see the same encoding.")

    def check(self) -> None:
        super().check()
        size = self.condition_image_size
        if size is not None and not (len(size) == 2 and all(v > 0 for v in size)):
            raise ValueError(f"condition_image_size={list(size)!r}: expected [height, width] in px (two positive "
                             f"integers), or null for the output's size")


def check_multiple(key: str, value: int, factor: int, why: str) -> None:
    """Raise `ValueError` unless `value` is a positive multiple of `factor` (the message names
    the config key, the nearest valid values and why)."""
    if value < 1 or value % factor:
        raise ValueError(f"{key}={value}: expected a multiple of {factor} ({why}), e.g. {nearest_multiples(value, factor)}")


def check_frame_count(key: str, value: int, stride: int) -> None:
    """Raise `ValueError` unless `value` is `stride * k + 1` (video VAEs keep the first frame
    and compress the rest by `stride`)."""
    if value < 1 or (value - 1) % stride:
        low = (value - 1) // stride * stride + 1 if value > 1 else 1
        near = f"{low} or {low + stride}"
        raise ValueError(f"{key}={value}: expected {stride}k+1 frames (1, {stride + 1}, {2 * stride + 1}, ...), e.g. {near}")


def check_image_only(model_name: str, num_frames: int) -> None:
    if num_frames != 1:
        raise ValueError(f"rollout.sampling_options.num_frames={num_frames}: {model_name} makes images; expected 1")


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def linspace_to_one_over_n(num_steps: int) -> list[float]:
    """`linspace(1, 1/N, N)`: the unshifted sigmas Flux-style pipelines (Qwen-Image, LTX-2) pass
    to the scheduler, which shifts them by `mu` and appends the final 0."""
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps}: expected at least 1 denoising step")
    return np.linspace(1.0, 1.0 / num_steps, num_steps).tolist()


class DiffusionModelBase(OmniModelBase):
    family: ClassVar[str] = "diffusion"
    scheduler = None  # a diffusers FlowMatchEulerDiscreteScheduler, set by the adapter
    # What the config alone can check, before any weights load (`check_config`): None = images
    # only (num_frames must be 1), k = frame counts k*n + 1; and the pixel multiple every
    # checkpoint of the architecture needs (None: known only from the checkpoint's configs,
    # which `latent_shape` checks).
    frame_stride: ClassVar[int | None] = None
    size_multiple: ClassVar[int | None] = None
    # Editing models: every prompt comes with a source image (see the module docstring).
    takes_source_image: ClassVar[bool] = False
    # What a text-to-image adapter's user should switch to for an edit dataset.
    editing_hint: ClassVar[str] = "an editing adapter (e.g. QwenImageEditPipeline)"

    @classmethod
    def check_prompt_items(cls, items, where: str, adapter: str) -> None:
        """Raise `ValueError` when the prompts (`PromptItem`s read from `where`, e.g.
        "data.prompt_file='edits.jsonl'") are not the kind the adapter takes: source images for
        an editing model, none for a text-to-image one."""
        for i, item in enumerate(items):
            has_image = bool((item.media or {}).get("images"))
            if has_image and not cls.takes_source_image:
                raise ValueError(
                    f"{where}: prompt {i + 1} ({_short(item.prompt)}) carries a source image, but model.adapter={adapter} "
                    f"makes images from text; use {cls.editing_hint} for an edit dataset, "
                    f"or a prompt file without images"
                )
            if cls.takes_source_image and not has_image:
                raise ValueError(
                    f"{where}: prompt {i + 1} ({_short(item.prompt)}) has no source image, but model.adapter={adapter} "
                    f"edits images; give every row a source_image (see omni_rl/data/edit_prompts.py), or use a "
                    f"text-to-image adapter"
                )

    def condition_images(self, images, height: int, width: int) -> tuple[torch.Tensor, ...] | None:
        """A prompt's source images (RGB PIL images, or None) as the request's condition images:
        uint8 [H, W, 3] tensors at the size the model encodes them for an output of height x
        width. Text-to-image models take none (None); editing models override this."""
        if images:
            raise ValueError(f"{type(self).__name__} makes images from text and takes no source image")
        return None

    @classmethod
    def check_config(cls, cfg) -> None:
        r = cfg.rollout.sampling_options
        if cls.frame_stride is None:
            check_image_only(cfg.model.adapter, r.num_frames)
        else:
            check_frame_count("rollout.sampling_options.num_frames", r.num_frames, cls.frame_stride)
        if cls.size_multiple is not None:
            check_multiple("rollout.sampling_options.height", r.height, cls.size_multiple, f"what {cfg.model.adapter} takes")
            check_multiple("rollout.sampling_options.width", r.width, cls.size_multiple, f"what {cfg.model.adapter} takes")
        check_sample_memory(r.height, r.width, r.num_frames)
        # The step's decoded samples here; their latents once the model's configs say how large.
        check_step_memory(cfg, on_cpu=runs_on_cpu(cfg.trainer.device))

    @classmethod
    def config_latent_numel(cls, cfg, configs) -> Optional[int]:
        """Elements of one sample's latent at the rollout geometry, from the component configs, before
        the model loads (for `omni_rl.models.limits`); None where the configs do not say.
        """
        return None

    def sigmas(self, num_steps: int, height: int | None = None, width: int | None = None,
               num_frames: int = 1) -> torch.Tensor:
        """The schedule's sigmas for `num_steps` denoising steps, [num_steps + 1] fp32 (last 0),
        for an output of that geometry (most schedules ignore it; see `schedule_mu`).

        A copy of the scheduler is used so that asking never changes the adapter's state."""
        mu = None if height is None or width is None else self.schedule_mu(height, width, num_frames)
        if mu is None and self.scheduler.config.get("use_dynamic_shifting", False):
            raise ValueError(
                f"{type(self).__name__}'s schedule shifts with the output's sequence length: pass height and width "
                f"(and num_frames) to sigmas()"
            )
        cache = self.__dict__.setdefault("_sigma_cache", {})
        key = (num_steps, mu)
        if key not in cache:
            scheduler = copy.deepcopy(self.scheduler)
            kwargs = {} if mu is None else {"mu": mu}
            spacing = self.base_sigmas(num_steps)
            if spacing is None:
                scheduler.set_timesteps(num_steps, device="cpu", **kwargs)
            else:
                scheduler.set_timesteps(sigmas=[float(s) for s in spacing], device="cpu", **kwargs)
            cache[key] = scheduler.sigmas.detach().to(torch.float32).cpu()
        return cache[key]

    def base_sigmas(self, num_steps: int) -> list[float] | None:
        """The unshifted sigmas the model's pipeline passes to `set_timesteps(sigmas=...)` before
        the scheduler shifts them, or None for the scheduler's own spacing (SD3, Wan). Flux-style
        pipelines (Qwen-Image, LTX-2) pass `linspace(1, 1/N, N)`: see `linspace_to_one_over_n`."""
        return None

    def schedule_mu(self, height: int, width: int, num_frames: int = 1) -> float | None:
        """The dynamic shift `mu` of the schedule at this geometry (diffusers' `calculate_shift`
        of the latent sequence length, for schedulers with `use_dynamic_shifting`), or None for a
        fixed schedule (SD3, Wan)."""
        return None

    @abstractmethod
    def latent_shape(self, height: int, width: int, num_frames: int = 1) -> tuple[int, ...]:
        """Shape of one sample's latent (no batch dim) for an output of height x width (x frames)."""

    @abstractmethod
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        """Embeddings for each prompt (and the negative prompt, for CFG), batch first."""

    @abstractmethod
    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor, conditioning: Conditioning, guidance_scale: float
    ) -> torch.Tensor:
        """Velocity v = x_1 - x_0 at (latents, sigma [B]) with CFG, fp32, shape of `latents`."""

    @abstractmethod
    def decode(self, latents) -> torch.Tensor:
        """Clean latents -> uint8 pixels, channels last."""

    def encode_images(self, images: torch.Tensor):
        """uint8 pixels [N, H, W, C] -> clean latents [N, *latent_shape], fp32: `decode`'s inverse
        through the VAE (its mean), for training on given images (offline Diffusion-DPO)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not encode images into latents; offline preference pairs need an adapter "
            f"with encode_images (StableDiffusion3Pipeline has one)"
        )

    def decode_audio(self, latents) -> tuple[torch.Tensor, int]:
        """Clean latents -> (waveform float32 [B, channels, samples] in [-1, 1], sample rate), for
        models that set `makes_audio`."""
        raise NotImplementedError(f"{type(self).__name__} makes no audio (makes_audio is False)")

"""How each model family samples: the `Sampling` options a family declares (`ModelFamily.Sampling`),
set in `rollout.sampling_options` and bound at load by the composition root.

`DiffusionSampling` holds an image, video or audio model's knobs (size, steps, guidance, the step
kernel and its SDE window); `TextSampling` a language model's (temperature, nucleus, response
length, stop tokens); `TalkerSampling` a spoken answer's (the text's knobs, then the speech's
temperature and length); `ThinkDrawSampling` both halves of a plan-then-image trajectory (the plan's
temperature and length beside the image's knobs). Each `check()` holds the rules that read only
its own fields (a window inside the step count, a registered kernel); rules that read other
sections stay with the family's `check_config`. Not here: how a request is built from them (the
family's `request`), or what a backend does with them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from omni_rl.algos import STEP_KERNELS
from omni_rl.option import ComponentOptions, option
from omni_rl.rollout.sde_window import READERS, SDE_WINDOW_SCHEDULES, SdeWindowOptions

__all__ = ["DiffusionSampling", "TalkerSampling", "TextSampling", "ThinkDrawSampling", "TokenSampling"]

KEY = "rollout.sampling_options"


@dataclass
class DiffusionSampling(ComponentOptions):
    """A diffusion model's sampling (`rollout.sampling_options`): one sample's geometry, its
    denoising steps and guidance, and which steps are stochastic (and trained)."""

    height: int = option(32, "Image (or frame) height in pixels, a multiple of 8.")
    width: int = option(32, "Image (or frame) width in pixels, a multiple of 8.")
    num_steps: int = option(6, "Denoising steps per sample (>= 1).")
    guidance_scale: float = option(4.5, "Classifier-free guidance scale (>= 1.0; 1.0 disables CFG).")
    negative_prompt: str = option("", "The negative prompt of classifier-free guidance.")
    num_frames: int = option(1, "Frames per sample: 1 = an image; a video model takes its own counts (Wan2.2: "
                                "4k+1), and image rewards then need reward.rewards[i].video_frames.")
    fps: float = option(16.0, "Playback rate of the frames: the saved videos', and the model's where it is "
                              "conditioned on it (> 0).")
    kernel: str = option("sde", "Step kernel used inside the SDE window: sde | cps | dance_sde | ode.")
    noise_level: float = option(0.7, "The stochastic kernel's noise level (>= 0).")
    sde_window_size: int = option(0, "Steps that are stochastic (and trained) per sample; 0 = every step "
                                     "(Flow-GRPO).")
    sde_window_range: Optional[list[int]] = option(None, "[lo, hi): the window's first step is drawn per sample "
                                                         "from lo .. hi - sde_window_size; null = [0, num_steps).")
    sde_window_schedule: str = option(
        "fixed", "How the window moves over training (MixGRPO; omni_rl/rollout/sde_window.py): fixed (each sample "
                 "draws its start from its seed, in sde_window_range), progressive (one window per training step, "
                 "sliding from lo by `shift` steps every `tau` training steps up to hi - size), random (one window "
                 "per training step, drawn from (trainer.seed, step)), decay (one per step at lo, its size shrinking "
                 "by one every `tau` training steps down to `min_size`). Needs sde_window_size > 0 unless fixed.")
    sde_window_options: SdeWindowOptions = field(default_factory=SdeWindowOptions, metadata={
        "doc": "The schedules' options (omni_rl.rollout.sde_window.SdeWindowOptions: shift, tau, min_size).",
        "infinite": False})

    def check(self) -> None:
        for name in ("num_steps", "num_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected an integer >= 1")
        if self.sde_window_size < 0:
            raise ValueError(f"sde_window_size={self.sde_window_size!r}: expected an integer >= 0")
        for name in ("height", "width"):
            value = getattr(self, name)
            if not (value >= 8 and value % 8 == 0):
                raise ValueError(f"{name}={value!r}: expected a positive multiple of 8 pixels")
        self._check_window()
        if not (self.noise_level >= 0 and math.isfinite(self.noise_level)):
            raise ValueError(f"noise_level={self.noise_level!r}: expected a finite value >= 0")
        if not self.guidance_scale >= 1.0:
            raise ValueError(f"guidance_scale={self.guidance_scale!r}: expected >= 1.0 (1.0 disables CFG)")
        if not (self.fps > 0 and math.isfinite(self.fps)):
            raise ValueError(f"fps={self.fps!r}: expected a frame rate > 0, e.g. 16 (Wan2.2) or 24 (LTX-2)")
        if self.kernel not in STEP_KERNELS:
            raise ValueError(f"kernel={self.kernel!r}: unknown {STEP_KERNELS.kind}; registered: "
                             f"{', '.join(STEP_KERNELS.names())}")

    def _check_window(self) -> None:
        """The window fits the step count and its range; the schedule has a window to move and
        reads the options set for it."""
        steps, size = self.num_steps, self.sde_window_size
        window = size or steps
        if window > steps:
            raise ValueError(f"sde_window_size={size!r}: expected at most {KEY}.num_steps = {steps} "
                             f"(0 means every step)")
        if self.sde_window_range is not None:
            rng = list(self.sde_window_range)
            if not (len(rng) == 2 and 0 <= rng[0] < rng[1] <= steps):
                raise ValueError(f"sde_window_range={rng!r}: expected [lo, hi) with 0 <= lo < hi <= "
                                 f"{KEY}.num_steps = {steps}")
            # The width the window needs, as the user set it: 0 means every step, i.e. num_steps.
            why = (f"{KEY}.sde_window_size" if size else
                   f"{KEY}.num_steps, since {KEY}.sde_window_size=0 makes every step stochastic")
            if rng[1] - rng[0] < window:
                raise ValueError(f"sde_window_range={rng!r}: expected a range at least {window} steps wide ({why}), "
                                 f"or null for every step")
        schedule = self.sde_window_schedule
        if schedule not in SDE_WINDOW_SCHEDULES:
            raise ValueError(f"sde_window_schedule={schedule!r}: expected one of {', '.join(SDE_WINDOW_SCHEDULES)}")
        if schedule != "fixed" and size < 1:
            raise ValueError(f"sde_window_schedule={schedule!r}: expected fixed with {KEY}.sde_window_size=0 "
                             f"(every step is stochastic: there is no window to move); set {KEY}.sde_window_size, "
                             f"e.g. 2")
        options = self.sde_window_options
        if not isinstance(options, SdeWindowOptions):
            return  # a mapping not bound yet (the composition root binds it before this check)
        for name, used_by in READERS.items():
            value = getattr(options, name)
            if value != 1 and schedule not in used_by:
                raise ValueError(f"sde_window_options.{name}={value!r}: expected 1 (its default) with "
                                 f"{KEY}.sde_window_schedule={schedule}: only {' and '.join(used_by)} read it; "
                                 f"remove it or set the schedule")
        if options.min_size > max(size, 1):
            raise ValueError(f"sde_window_options.min_size={options.min_size!r}: expected at most "
                             f"{KEY}.sde_window_size = {size}")


@dataclass
class TokenSampling(ComponentOptions):
    """How tokens are drawn from a language head: a text model's responses, a think-draw
    model's plans."""

    temperature: float = option(1.0, "Sampling temperature of the response tokens (> 0); the log-probs are of "
                                     "the tempered distribution.")
    max_new_tokens: int = option(256, "The longest response in tokens; longer ones are cut and counted in "
                                      "response/clip_ratio.")

    def check(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature!r}: expected > 0")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r}: expected >= 1")


@dataclass
class TextSampling(TokenSampling):
    """A language model's sampling (`rollout.sampling_options`): the autoregressive and agent
    families' (and the talker's answer, `TalkerSampling`)."""

    top_p: float = option(1.0, "Nucleus sampling: keep the smallest set of tokens of mass >= top_p (1 = all).")
    stop_token_ids: list[int] = option([], "Extra stop tokens besides the tokenizer's end-of-turn token(s).")

    def check(self) -> None:
        TokenSampling.check(self)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r}: expected in (0, 1]")


@dataclass
class TalkerSampling(TextSampling):
    """A spoken answer's sampling (`rollout.sampling_options`): the thinker's answer with the
    text knobs, then the talker's frames with their own temperature and length."""

    speech_temperature: float = option(1.0, "Sampling temperature of the talker's and the code predictor's codec "
                                            "tokens (> 0); a frame's log-prob is of the tempered distributions.")
    max_frames: int = option(64, "The longest utterance in frames; longer ones are cut and counted in "
                                 "response/speech_clip_ratio (Qwen3-Omni: 12.5 frames a second).")

    def check(self) -> None:
        TextSampling.check(self)
        if not (math.isfinite(self.speech_temperature) and self.speech_temperature > 0):
            raise ValueError(f"speech_temperature={self.speech_temperature!r}: expected a finite number > 0")
        if self.max_frames < 1:
            raise ValueError(f"max_frames={self.max_frames!r}: expected >= 1")


@dataclass
class ThinkDrawSampling(DiffusionSampling, TokenSampling):
    """A think-draw (or write-draw) model's sampling (`rollout.sampling_options`): the image's
    knobs and the plan's temperature and max_new_tokens, one trajectory's sampling in one block."""

    def check(self) -> None:
        DiffusionSampling.check(self)
        TokenSampling.check(self)

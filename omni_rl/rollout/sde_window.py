"""Which denoising steps of a sample are stochastic (and trained): its SDE window.

MixGRPO (arXiv 2507.21802) / Flow-GRPO-Fast sample with an SDE only inside a window of
consecutive steps and with the ODE elsewhere, training only the window; `rollout.sampling_options.sde_window_schedule`
(`fixed`, `progressive`, `random`, `decay`; tabled in docs/algorithms.md) says where it lies.
`choose_sde_window` is the per-sample draw and `scheduled_sde_window` a global schedule's window
for a training step (None for `fixed`); both depend only on their arguments (a private RNG keyed
by the seed), so a resumed run draws the windows an uninterrupted one would. The schedules'
options (`SdeWindowOptions`, nested in a diffusion family's sampling options) are bound and
checked against the schedule at load (`omni_rl.families.sampling.DiffusionSampling`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from omni_rl.option import ComponentOptions, option

SDE_WINDOW_SCHEDULES = ("fixed", "progressive", "random", "decay")


@dataclass
class SdeWindowOptions(ComponentOptions):
    """The window schedules' options (`rollout.sampling_options.sde_window_options`); each is read by the
    schedules of `READERS` only."""

    shift: int = option(1, "progressive: steps the window slides by every tau training steps (>= 1).")
    tau: int = option(1, "progressive and decay: training steps between two moves of the window (>= 1).")
    min_size: int = option(1, "decay: the smallest window the size shrinks to (1 .. rollout.sampling_options.sde_window_size).")

    def check(self) -> None:
        for name in ("shift", "tau", "min_size"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name}={value!r}: expected an integer >= 1")


# Option -> the schedules that read it.
READERS = {"shift": ("progressive",), "tau": ("progressive", "decay"), "min_size": ("decay",)}


def choose_sde_window(seed: int, num_steps: int, size: int, window_range: tuple[int, int] | None) -> tuple[int, int]:
    """Return [start, stop) of the window; `size` 0 means every step."""
    if size == 0:
        return (0, num_steps)
    lo, hi = _check_range(num_steps, size, window_range)
    # A private RNG keyed by the seed: independent of torch's global state and of the noise.
    start = random.Random(f"sde-window-{seed}").randint(lo, hi - size)
    return (start, start + size)


def scheduled_sde_window(
    schedule: str,
    step: int,
    seed: int,
    num_steps: int,
    size: int,
    window_range: tuple[int, int] | None = None,
    shift: int = 1,
    tau: int = 1,
    min_size: int = 1,
) -> Optional[tuple[int, int]]:
    """[start, stop) of training step `step`'s window under a global `schedule`; None for
    "fixed" (each sample draws its own with `choose_sde_window`)."""
    if schedule not in SDE_WINDOW_SCHEDULES:
        raise ValueError(f"sde_window_schedule={schedule!r}; expected one of {', '.join(SDE_WINDOW_SCHEDULES)}")
    if schedule == "fixed":
        return None
    if size < 1:
        raise ValueError(f"sde_window_schedule={schedule!r} moves a window, but sde_window_size={size} (every step)")
    if step < 1 or shift < 1 or tau < 1 or not 1 <= min_size <= size:
        raise ValueError(
            f"step={step}, shift={shift}, tau={tau}, min_size={min_size}: expected step, shift, tau >= 1 "
            f"(training steps count from 1) and 1 <= min_size <= size={size}"
        )
    lo, hi = _check_range(num_steps, size, window_range)
    moves = (step - 1) // tau
    if schedule == "progressive":
        start = min(lo + shift * moves, hi - size)
    elif schedule == "random":
        start = random.Random(f"sde-window-step-{seed}-{step}").randint(lo, hi - size)
    else:  # decay
        start, size = lo, max(min_size, size - moves)
    return (start, start + size)


def _check_range(num_steps: int, size: int, window_range: tuple[int, int] | None) -> tuple[int, int]:
    lo, hi = window_range if window_range is not None else (0, num_steps)
    if not (0 <= lo < hi <= num_steps) or hi - lo < size:
        raise ValueError(
            f"SDE window of {size} steps does not fit range [{lo}, {hi}) of {num_steps} steps; "
            f"expected 0 <= lo < hi <= num_steps and hi - lo >= size"
        )
    return lo, hi

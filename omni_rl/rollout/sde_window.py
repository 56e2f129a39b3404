"""Which denoising steps of a sample are stochastic (and trained): its SDE window.

MixGRPO / Flow-GRPO-Fast sample with an SDE only inside a window of consecutive steps and with
the ODE elsewhere, training only the window. The window's first step is drawn from the
sample's own seed, so it does not depend on what the sample was batched with.
"""
from __future__ import annotations

import random


def choose_sde_window(seed: int, num_steps: int, size: int, window_range: tuple[int, int] | None) -> tuple[int, int]:
    """Return [start, stop) of the window; `size` 0 means every step."""
    if size == 0:
        return (0, num_steps)
    lo, hi = window_range if window_range is not None else (0, num_steps)
    if not (0 <= lo < hi <= num_steps) or hi - lo < size:
        raise ValueError(
            f"SDE window of {size} steps does not fit range [{lo}, {hi}) of {num_steps} steps; "
            f"expected 0 <= lo < hi <= num_steps and hi - lo >= size"
        )
    # A private RNG keyed by the seed: independent of torch's global state and of the noise.
    start = random.Random(f"sde-window-{seed}").randint(lo, hi - size)
    return (start, start + size)

"""`Renamed`: a metric logger seen through another namespace.

Validation of the weights' EMA runs the very code that validates the trained weights (the
family's `validate`), which names what it logs `val/...`; through `Renamed(logger, "val",
"val_ema")` those names arrive as `val_ema/...`: metrics (`rename`), images, videos and audio.
Names outside the namespace pass unchanged.
"""
from __future__ import annotations

from typing import Any, Mapping


def renamed(name: str, old: str, new: str) -> str:
    """`old/rest` -> `new/rest`; any other name as it is."""
    return f"{new}/{name[len(old) + 1:]}" if name.startswith(old + "/") else name


def rename(metrics: Mapping[str, Any], old: str, new: str) -> dict[str, Any]:
    return {renamed(k, old, new): v for k, v in metrics.items()}


class Renamed:
    """`logger` (a `MetricLogger`) with the namespace `old` written as `new`."""

    def __init__(self, logger, old: str, new: str):
        self.logger, self.old, self.new = logger, old, new

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.logger.log(rename(metrics, self.old, self.new), step)

    def log_image(self, tag: str, image: Any, step: int) -> None:
        self.logger.log_image(renamed(tag, self.old, self.new), image, step)

    def log_video(self, tag: str, frames: Any, fps: float, step: int) -> None:
        self.logger.log_video(renamed(tag, self.old, self.new), frames, fps, step)

    def log_audio(self, tag: str, waveform: Any, sample_rate: int, step: int) -> None:
        self.logger.log_audio(renamed(tag, self.old, self.new), waveform, sample_rate, step)

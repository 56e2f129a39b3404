"""What a validation step writes for video and audio-video samples.

`write_video_samples(...)` writes each sample as an mp4 (with its sound) under
`folder/val_step_NNNNNN/`, a captioned contact sheet per sample as `val_step_NNNNNN.png`, and
logs the sheets and the first `log_videos` videos (`val/video/N`, `val/audio/N`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from omni_rl.logging.video import save_video, video_grid
from omni_rl.utils.atomic import atomic_save_image


def write_video_samples(
    folder: Path, step: int, videos: torch.Tensor, fps: float, captions: Sequence[str], logger,
    audio: Optional[torch.Tensor] = None, sample_rate: Optional[int] = None, log_videos: int = 4,
) -> list[Path]:
    """Write the step's samples (uint8 videos [N, T, H, W, 3]); returns the mp4 paths."""
    step_dir = Path(folder) / f"val_step_{step:06d}"
    paths = []
    for i, frames in enumerate(videos):
        sound = None if audio is None else audio[i].clamp(-1, 1)
        paths.append(save_video(frames, step_dir / f"{i:02d}.mp4", fps, audio=sound, sample_rate=sample_rate))
    sheet = video_grid(list(videos), captions=list(captions))
    atomic_save_image(sheet, Path(folder) / f"val_step_{step:06d}.png")
    logger.log_image("val/samples", np.asarray(sheet), step)
    for i in range(min(log_videos, len(videos))):
        logger.log_video(f"val/video/{i}", videos[i], fps, step)
        if audio is not None:
            logger.log_audio(f"val/audio/{i}", audio[i].clamp(-1, 1), sample_rate, step)
    return paths

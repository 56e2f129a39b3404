"""`clip_frame_consistency`: how alike a video's consecutive frames look to CLIP.

    clip_frame_consistency = mean over t of cos(e[t], e[t + 1])          in [-1, 1]

with e[t] CLIP's unit-norm embedding of frame t (a one-frame video scores 1). Unlike
`temporal_smoothness`'s pixel differences it measures change in what CLIP sees, so a pan over
one scene stays consistent; it is not VBench's subject consistency. Options: `model`
(`openai/clip-vit-large-patch14`), `processor`, `frames` (None: all; k: k evenly spaced), `device`.
"""
from __future__ import annotations

import numbers
from typing import Any, Sequence

from omni_rl.reward import register_reward
from omni_rl.reward.media import frame_indices
from rewards.clip_embedder import DEFAULT_CLIP, ClipEmbedder
from rewards.pretrained import device_network
from rewards.video_stats import media_of


class ClipFrameConsistency:
    def __init__(self, model: str, processor: str | None, frames: int | None, device: str):
        self.frames = frames
        self.clip = ClipEmbedder("clip_frame_consistency", model, processor, device)

    def __call__(self, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        video = media_of("clip_frame_consistency", samples, prompts, metadata, "video").video
        count, length = video.shape[0], int(video.shape[1])
        if length == 1:
            return [1.0] * count
        # Never more frames than the video has: a repeated frame would add a cosine of 1.
        index = frame_indices(length, min(self.frames, length)) if self.frames is not None else list(range(length))
        chosen = video[:, index]  # [B, k, H, W, C]
        k = chosen.shape[1]
        embeddings = self.clip.images(chosen.flatten(0, 1)).view(count, k, -1)
        cosines = (embeddings[:, 1:] * embeddings[:, :-1]).sum(-1)  # [B, k - 1]
        return cosines.mean(1).cpu().tolist()


def _check_options(*, frames: int | None = None, **_: Any) -> None:
    if frames is not None and (isinstance(frames, bool) or not isinstance(frames, numbers.Integral) or frames < 2):
        raise ValueError(f"frames={frames!r}; expected an int >= 2 (evenly spaced frames to compare), or None for all")


@register_reward("clip_frame_consistency", modalities={"video"}, check_options=_check_options,
                 device_networks=device_network("CLIPModel", "model", DEFAULT_CLIP, "clip_frame_consistency"))
def clip_frame_consistency(
    *, model: str = DEFAULT_CLIP, processor: str | None = None, frames: int | None = None, device: str = "auto",
) -> ClipFrameConsistency:
    """Mean cosine of consecutive frames' CLIP image embeddings, in [-1, 1]."""
    return ClipFrameConsistency(model, processor, frames, device)

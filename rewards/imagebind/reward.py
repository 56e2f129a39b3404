"""The `imagebind` reward: cosine similarities between ImageBind embeddings of a sample's
modalities (and of its prompt).

`mode`: `text_audio` cos(prompt, audio), `text_video` cos(prompt, video, the default),
`audio_video` cos(audio, video), `all` the mean of the three; the reward declares what it scores
by mode. Samples come as a `MediaSamples` (or audio clips, uint8 videos, or a dict of both, at
`metadata[i]["sample_rate"]` / `["fps"]` or the options). As in ImageBind's own inference, a
sample is embedded as `audio_clips` (3) 2-second audio clips and `video_clips` (5) 2-second video
clips x 3 crops, averaged before the cosine; fp32, eval mode, no gradients. Options: `checkpoint`
(required: Meta's `imagebind_huge.pth` layout; its weights are CC-BY-NC-SA 4.0, non-commercial),
`mode`, `config`, `tokenizer`, `sample_rate`, `fps`, `audio_clips`, `video_clips`, `device`.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np
import torch

from omni_rl.device import pick_device
from omni_rl.reward import MediaSamples, RewardInputError, register_reward
from omni_rl.reward.inputs import check_prompts_metadata
from omni_rl.utils.audio import resample
from rewards.audio_inputs import audio_clips as parse_audio
from rewards.audio_inputs import check_sample_rate
from rewards.pretrained import load_pretrained
from rewards.imagebind.data import AUDIO_RATE, audio_features, tokenize, video_features
from rewards.imagebind.model import ImageBindConfig, ImageBindModel, build_model, read_state_dict

MODES = {
    "text_audio": ("text", "audio"),
    "text_video": ("text", "video"),
    "audio_video": ("audio", "video"),
    "all": ("text", "audio", "video"),
}
DEFAULT_TOKENIZER = "openai/clip-vit-large-patch14"


def modalities_for(*, mode: str = "text_video", **_: Any) -> frozenset[str]:
    """What the reward scores in `mode` (the prompt is no sample stream): audio and/or video."""
    if mode not in MODES:
        raise ValueError(f"imagebind: mode={mode!r}; expected one of {sorted(MODES)}")
    return frozenset(MODES[mode]) - {"text"}


def _video_list(
    samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]], fps: float | None,
) -> list[tuple[torch.Tensor, float]]:
    """Check the video input; return (uint8 [T, H, W, 3] CPU tensor, fps) per sample."""
    if isinstance(samples, MediaSamples):
        if samples.video is None:
            raise RewardInputError(
                "imagebind: the MediaSamples hold no video (only audio); this mode scores video: pass "
                "MediaSamples(video=..., fps=...)"
            )
        check_prompts_metadata(len(samples), prompts, metadata, "samples", "imagebind")
        if samples.video.shape[-1] != 3:
            raise RewardInputError(
                f"imagebind: MediaSamples.video has shape {tuple(samples.video.shape)}; expected RGB [B, T, H, W, 3] "
                f"(a grey video: video.expand(-1, -1, -1, -1, 3))"
            )
        return [(video.detach().cpu(), samples.fps) for video in samples.video]
    if isinstance(samples, (torch.Tensor, np.ndarray)):
        if samples.ndim != 5:
            hint = " (one video? add the batch dim: video[None])" if samples.ndim == 4 else ""
            raise RewardInputError(
                f"imagebind: video has shape {tuple(samples.shape)}; expected uint8 [B, T, H, W, 3]{hint}"
            )
        videos = list(samples)
    elif isinstance(samples, (list, tuple)):
        videos = list(samples)
    else:
        raise RewardInputError(
            f"imagebind: video has type {type(samples).__name__}; expected a uint8 tensor [B, T, H, W, 3] or a "
            f"list of uint8 [T, H, W, 3] tensors/arrays"
        )
    if not videos:
        raise RewardInputError("imagebind: the batch is empty; a reward needs at least one video")
    check_prompts_metadata(len(videos), prompts, metadata, "samples", "imagebind")
    out = []
    for i, video in enumerate(videos):
        if isinstance(video, np.ndarray):
            video = torch.from_numpy(np.ascontiguousarray(video))
        if not isinstance(video, torch.Tensor):
            raise RewardInputError(
                f"imagebind: video[{i}] has type {type(video).__name__}; expected a uint8 tensor [T, H, W, 3]"
            )
        if video.dtype != torch.uint8:
            raise RewardInputError(
                f"imagebind: video[{i}] has dtype {video.dtype}; expected uint8 0..255. Convert [0, 1] floats with "
                f"(video.clamp(0, 1) * 255).round().to(torch.uint8)"
            )
        if video.ndim != 4 or video.shape[-1] != 3 or video.shape[0] == 0:
            hint = " (channels first? use video.permute(0, 2, 3, 1))" if video.ndim == 4 and video.shape[1] == 3 else ""
            raise RewardInputError(
                f"imagebind: video[{i}] has shape {tuple(video.shape)}; expected [T, H, W, 3] with T >= 1{hint}"
            )
        rate = metadata[i].get("fps", fps)
        if rate is None:
            raise RewardInputError(
                f"imagebind: video[{i}] has no frame rate; put it in metadata[{i}]['fps'] or pass the reward "
                f"option fps=..."
            )
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not rate > 0:
            raise RewardInputError(f"imagebind: the frame rate of video[{i}] is {rate!r}; expected a number > 0")
        out.append((video.detach().cpu(), float(rate)))
    return out


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"imagebind: {name}={value!r}; expected an int >= 1")
    return int(value)


class ImageBindScorer:
    def __init__(
        self, checkpoint: str | None, mode: str, config: dict[str, Any] | None, tokenizer: str,
        sample_rate: int | None, fps: float | None, audio_clips: int, video_clips: int, device: str,
    ):
        if mode not in MODES:
            raise ValueError(f"imagebind: mode={mode!r}; expected one of {sorted(MODES)}")
        if checkpoint is None:
            raise ValueError(
                "imagebind: no checkpoint given; pass checkpoint=/path/to/imagebind_huge.pth (Meta's ImageBind "
                "weights, licensed CC-BY-NC-SA 4.0: non-commercial use only)"
            )
        check_sample_rate("imagebind", sample_rate)
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not fps > 0):
            raise ValueError(f"imagebind: fps={fps!r}; expected a number > 0 or None")
        if config is not None and not isinstance(config, Mapping):
            raise ValueError(
                f"imagebind: config has type {type(config).__name__}; expected a dict of ImageBindConfig sizes"
            )
        self.mode, self.uses = mode, MODES[mode]
        self.sample_rate, self.fps = sample_rate, fps
        self.n_audio_clips = _positive_int("audio_clips", audio_clips)
        self.n_video_clips = _positive_int("video_clips", video_clips)
        self.config = ImageBindConfig.from_dict(dict(config) if config is not None else None)
        self.device = pick_device(device)
        state = read_state_dict(checkpoint)
        self.model = build_model(self.config, state, f"checkpoint={checkpoint!r}").to(self.device)
        self.tokenizer = None
        if "text" in self.uses:
            from transformers import CLIPTokenizer

            self.tokenizer = load_pretrained(CLIPTokenizer, tokenizer, "tokenizer", "imagebind")

    def _part(self, samples: Any, key: str) -> Any:
        if isinstance(samples, MediaSamples):
            return samples  # audio_clips and _video_list read their own stream of it
        if isinstance(samples, dict):
            if key not in samples:
                raise RewardInputError(
                    f"imagebind: mode {self.mode!r} needs samples[{key!r}]; got a dict with keys {sorted(samples)}"
                )
            return samples[key]
        if len(self.uses) == 3 or "text" not in self.uses:
            raise RewardInputError(
                f"imagebind: mode {self.mode!r} needs both audio and video: pass samples as "
                f"{{'audio': ..., 'video': ...}}, got a {type(samples).__name__}"
            )
        return samples

    @torch.no_grad()
    def _embed_audio(self, clips: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
        c = self.config
        mels = torch.stack([
            audio_features(resample(clip, rate, AUDIO_RATE), num_mel_bins=c.audio_num_mel_bins,
                           target_len=c.audio_target_len, n_clips=self.n_audio_clips)
            for clip, rate in clips
        ])  # [B, S, 1, mel, frames]
        b, s = mels.shape[:2]
        emb = self.model.embed_audio(mels.flatten(0, 1).to(self.device)).view(b, s, -1).mean(dim=1)
        return torch.nn.functional.normalize(emb.float(), dim=-1)

    @torch.no_grad()
    def _embed_video(self, videos: list[tuple[torch.Tensor, float]]) -> torch.Tensor:
        clips = torch.stack([
            video_features(frames, fps, image_size=self.config.image_size, n_clips=self.n_video_clips)
            for frames, fps in videos
        ])  # [B, S, 3, 2, size, size]
        b, s = clips.shape[:2]
        emb = self.model.embed_vision(clips.flatten(0, 1).to(self.device)).view(b, s, -1).mean(dim=1)
        return torch.nn.functional.normalize(emb.float(), dim=-1)

    @torch.no_grad()
    def _embed_text(self, prompts: Sequence[str]) -> torch.Tensor:
        ids = tokenize(self.tokenizer, prompts, self.config.context_length).to(self.device)
        return torch.nn.functional.normalize(self.model.embed_text(ids).float(), dim=-1)

    def __call__(self, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        # Parse and check every input before any model runs (each part against len(prompts)).
        audio = video = None
        if "audio" in self.uses:
            audio = parse_audio("imagebind", self._part(samples, "audio"), prompts, metadata, self.sample_rate)
        if "video" in self.uses:
            video = _video_list(self._part(samples, "video"), prompts, metadata, self.fps)
        emb = {}
        if audio is not None:
            emb["audio"] = self._embed_audio(audio)
        if video is not None:
            emb["video"] = self._embed_video(video)
        if "text" in self.uses:
            emb["text"] = self._embed_text(prompts)
        pairs = [(a, b) for i, a in enumerate(self.uses) for b in self.uses[i + 1:]]
        cosines = torch.stack([(emb[a] * emb[b]).sum(dim=-1) for a, b in pairs])
        return cosines.mean(dim=0).cpu().tolist()


def _check_options(*, mode: str = "text_video", **_: Any) -> None:
    modalities_for(mode=mode)


def _device_networks(*, config: dict[str, Any] | None = None, **_: Any) -> list[tuple[str, torch.nn.Module]]:
    """The network the scorer builds (every modality it keeps, whatever the mode), fp32."""
    sizes = ImageBindConfig.from_dict(dict(config) if config is not None else None)
    with torch.device("meta"):
        return [("imagebind" + ("_huge" if config is None else ""), ImageBindModel(sizes))]


@register_reward("imagebind", modalities=modalities_for, check_options=_check_options, device_networks=_device_networks)
def imagebind(
    *, checkpoint: str | None = None, mode: str = "text_video", config: dict[str, Any] | None = None,
    tokenizer: str = DEFAULT_TOKENIZER, sample_rate: int | None = None, fps: float | None = None,
    audio_clips: int = 3, video_clips: int = 5, device: str = "auto",
) -> ImageBindScorer:
    """ImageBind cosine similarity between a sample's modalities and/or its prompt (see `mode`)."""
    return ImageBindScorer(checkpoint, mode, config, tokenizer, sample_rate, fps, audio_clips, video_clips, device)

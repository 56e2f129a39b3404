"""CLAP reward: cosine similarity of CLAP's audio and prompt embeddings (LAION-CLAP through
transformers' `ClapModel`), plus the audio input contract that the audio rewards share.

    clap = cos(text_embedding(prompt), audio_embedding(resample(audio, 48 kHz)))      in [-1, 1]

Audio input (`samples`), one clip per prompt:
- a float tensor or numpy array [B, L] (all clips the same length), or
- a list of B 1-D float tensors / numpy arrays (lengths may differ);
mono, values roughly in [-1, 1]. The sample rate of clip i is `metadata[i]["sample_rate"]` when
present, else the factory option `sample_rate`; with neither, the call raises. Multi-channel
clips [B, C, L] and integer PCM are refused (mix down with `.mean(dim=1)`; divide int16 by
32768) rather than guessed at.

Each clip is resampled to the processor's rate (48 kHz for LAION-CLAP) with
`omni_rl.utils.audio.resample` (windowed sinc, its default method), then handed to
`ClapProcessor`'s feature extractor (log-mel, 10 s windows, short clips repeated then
zero-padded: "repeatpad"). A clip longer than the window is cut to its *first* window here,
because the extractor would otherwise crop it at a random place (`rand_trunc`) or fuse random
chunks (`fusion`) and the reward would not be a function of the sample. For fused
checkpoints the extractor's random `is_longer` flag is also replaced by the truth (no clip is
longer after the cut), for the same reason.

Options:
    model        a transformers `ClapModel` (default `laion/clap-htsat-unfused`; also e.g.
                 `laion/larger_clap_general`); hub id, local folder, or `tiny:clap-reward`.
    processor    where to load the `ClapProcessor` from (default: `model`).
    sample_rate  the rate of clips whose metadata has no `sample_rate` (default None: required
                 in the metadata).
    device       `auto` or a device name (see `omni_rl.device.pick_device`).

Prompts are padded to 77 tokens (and truncated there, as LAION-CLAP was trained) so a prompt's
embedding does not depend on its batch; the whole batch runs through each tower at once, fp32,
eval mode, no gradients.
"""
from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np
import torch

from omni_rl.device import pick_device
from omni_rl.reward import RewardInputError, register_reward
from omni_rl.reward.inputs import check_prompts_metadata
from omni_rl.utils.audio import resample
from rewards.pretrained import load_pretrained

DEFAULT_MODEL = "laion/clap-htsat-unfused"


# --------------------------------------------------------------------------------------------
# The audio input contract
# --------------------------------------------------------------------------------------------

def audio_clips(
    reward: str, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]], sample_rate: int | None,
) -> list[tuple[torch.Tensor, int]]:
    """Check one call's inputs; return the clips of `samples` as (1-D float32 CPU tensor, sample
    rate) pairs. See the module docstring for the contract."""
    if isinstance(samples, (torch.Tensor, np.ndarray)):
        if samples.ndim != 2:
            hint = " (multi-channel? mix down first: audio.mean(dim=1))" if samples.ndim == 3 else ""
            hint = " (one clip? add the batch dim: audio[None])" if samples.ndim == 1 else hint
            raise RewardInputError(
                f"{reward}: audio has shape {tuple(samples.shape)}; expected [B, L] mono clips{hint}"
            )
        clips = list(samples)
    elif isinstance(samples, (list, tuple)):
        clips = list(samples)
    else:
        raise RewardInputError(
            f"{reward}: samples has type {type(samples).__name__}; expected audio as a float tensor [B, L] or a "
            f"list of 1-D float tensors/arrays"
        )
    if not clips:
        raise RewardInputError(f"{reward}: the batch is empty; a reward needs at least one clip")
    check_prompts_metadata(len(clips), prompts, metadata, "samples", reward)
    out = []
    for i, clip in enumerate(clips):
        if isinstance(clip, np.ndarray):
            clip = torch.from_numpy(np.ascontiguousarray(clip))
        if not isinstance(clip, torch.Tensor):
            raise RewardInputError(
                f"{reward}: audio[{i}] has type {type(clip).__name__}; expected a 1-D float tensor or numpy array"
            )
        if not clip.is_floating_point():
            raise RewardInputError(
                f"{reward}: audio[{i}] has dtype {clip.dtype}; expected float samples in [-1, 1] "
                f"(int16 PCM: divide by 32768)"
            )
        if clip.ndim != 1 or clip.numel() == 0:
            raise RewardInputError(
                f"{reward}: audio[{i}] has shape {tuple(clip.shape)}; expected a non-empty 1-D mono clip "
                f"(mix stereo down with clip.mean(dim=0))"
            )
        clip = clip.detach().to("cpu", torch.float32)
        if not torch.isfinite(clip).all():
            raise RewardInputError(f"{reward}: audio[{i}] contains NaN or inf samples")
        rate = metadata[i].get("sample_rate", sample_rate)
        if rate is None:
            raise RewardInputError(
                f"{reward}: audio[{i}] has no sample rate; put it in metadata[{i}]['sample_rate'] or pass the "
                f"reward option sample_rate=..."
            )
        if isinstance(rate, bool) or not isinstance(rate, numbers.Integral) or rate <= 0:
            raise RewardInputError(
                f"{reward}: the sample rate of audio[{i}] is {rate!r}; expected a positive integer (Hz)"
            )
        out.append((clip, int(rate)))
    return out


def check_sample_rate(reward: str, sample_rate: Any) -> None:
    if sample_rate is None:
        return
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Integral) or sample_rate <= 0:
        raise ValueError(f"{reward}: sample_rate={sample_rate!r}; expected a positive integer (Hz) or None")


# --------------------------------------------------------------------------------------------
# The reward
# --------------------------------------------------------------------------------------------

class ClapScorer:
    def __init__(self, model: str, processor: str | None, sample_rate: int | None, device: str):
        from transformers import ClapModel, ClapProcessor

        check_sample_rate("clap", sample_rate)
        self.sample_rate = sample_rate
        self.device = pick_device(device)
        self.model = load_pretrained(ClapModel, model, "model", "clap").to(self.device).eval()
        self.processor = load_pretrained(ClapProcessor, processor or model, "processor", "clap")
        self.rate = int(self.processor.feature_extractor.sampling_rate)
        self.window = int(self.processor.feature_extractor.nb_max_samples)

    @torch.no_grad()
    def audio_embeddings(self, clips: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
        waves = [resample(clip, rate, self.rate)[: self.window].numpy() for clip, rate in clips]
        features = self.processor.feature_extractor(waves, sampling_rate=self.rate, return_tensors="pt")
        is_longer = torch.zeros(len(waves), 1, dtype=torch.bool)
        pooled = self.model.audio_model(
            input_features=features["input_features"].to(self.device, torch.float32),
            is_longer=is_longer.to(self.device),
        ).pooler_output
        return torch.nn.functional.normalize(self.model.audio_projection(pooled).float(), dim=-1)

    @torch.no_grad()
    def text_embeddings(self, prompts: Sequence[str]) -> torch.Tensor:
        tokens = self.processor.tokenizer(
            list(prompts), padding="max_length", truncation=True, max_length=77, return_tensors="pt",
        )
        pooled = self.model.text_model(
            input_ids=tokens["input_ids"].to(self.device), attention_mask=tokens["attention_mask"].to(self.device),
        ).pooler_output
        return torch.nn.functional.normalize(self.model.text_projection(pooled).float(), dim=-1)

    def __call__(self, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        clips = audio_clips("clap", samples, prompts, metadata, self.sample_rate)
        return (self.audio_embeddings(clips) * self.text_embeddings(prompts)).sum(dim=-1).cpu().tolist()


@register_reward("clap")
def clap(
    *, model: str = DEFAULT_MODEL, processor: str | None = None, sample_rate: int | None = None, device: str = "auto",
) -> ClapScorer:
    """CLAP cosine similarity in [-1, 1] of each audio clip with its prompt."""
    return ClapScorer(model, processor, sample_rate, device)

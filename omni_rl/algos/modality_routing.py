"""Modality-wise advantage routing: one advantage per latent stream of a joint audio-video model.

With rewards on the video (a video reward, or an image reward on frames) and on the audio, each
stream's advantage is the estimator's on that stream's own reward, the weighted sum of the rewards
that score its modality (`STREAM_MODALITIES`), normalised on its own; a reward scoring both
modalities (audio-video sync) counts for both. Each advantage weighs only its own stream's terms
of the loss.

How the step's log-prob splits: one step over several streams is one Gaussian action with one std
per sample, and its log-prob is the per-dimension mean over all D dimensions of all streams, so
with D_s stream s's dimensions and log p_s the per-dimension mean over them,

    log p = sum_s (D_s / D) log p_s        exactly.

The routed loss keeps that split: L = sum_s (D_s / D) L_s(log p_s, old log p_s, A_s), each L_s the
configured loss on its stream alone (a forward-process loss on the stream's columns of the flat
velocity). With every A_s equal its first on-policy gradient is the joint loss's; a stream whose
A_s is 0 (no reward scores its modality) contributes no gradient.

Not here: which rewards score what (the reward registry's `modalities`), the estimators
(`advantages`), the loss functions themselves.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import torch
from torch import Tensor

from omni_rl.algos.advantages import AdvantageInput, AdvantageEstimator
from omni_rl.algos.latent_streams import LatentStreams

__all__ = [
    "STREAM_MODALITIES",
    "stream_routes",
    "stream_rewards",
    "routed_advantages",
    "stream_columns",
    "routed_loss",
]

# The reward modalities that score each stream: the video stream is what video rewards and image
# rewards (on frames, `video_frames`) see; the audio stream what audio rewards hear.
STREAM_MODALITIES: dict[str, frozenset[str]] = {
    "video": frozenset({"video", "image"}),
    "audio": frozenset({"audio"}),
}


def stream_routes(reward_modalities: Mapping[str, frozenset[str]], streams: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """stream -> the rewards (names, in order) that score it. A stream named nowhere in
    `STREAM_MODALITIES` raises: its rewards cannot be told apart."""
    unknown = [s for s in streams if s not in STREAM_MODALITIES]
    if unknown:
        raise ValueError(f"latent streams {unknown}: modality routing knows the streams {sorted(STREAM_MODALITIES)}; "
                         f"add the stream's modalities to STREAM_MODALITIES")
    return {s: tuple(name for name, mods in reward_modalities.items() if mods & STREAM_MODALITIES[s]) for s in streams}


def stream_rewards(per_reward: Mapping[str, Tensor], weights: Mapping[str, float],
                   routes: Mapping[str, tuple[str, ...]], n: int) -> dict[str, Tensor]:
    """stream -> float32 [n], sum of weight * score over the stream's rewards that scored this batch
    (a failed optional reward is absent from `per_reward` and left out); zeros where none did."""
    out = {}
    for stream, names in routes.items():
        total = torch.zeros(n, dtype=torch.float32)
        for name in names:
            if name in per_reward:
                total = total + float(weights[name]) * per_reward[name].to(torch.float32).cpu()
        out[stream] = total
    return out


def routed_advantages(estimator: AdvantageEstimator, rewards: Mapping[str, Tensor], group_index: Tensor,
                      std_mode: str, eps: float) -> LatentStreams:
    """One advantage per stream, `[N]` each, the estimator on that stream's rewards alone: each
    normalised by its own std (std_mode), so a modality with small rewards is not drowned by the
    other's scale."""
    return LatentStreams({s: estimator(AdvantageInput(r, group_index, std_mode, eps)) for s, r in rewards.items()})


def stream_columns(latents: LatentStreams) -> dict[str, slice]:
    """stream -> its columns of `latent_streams.flat(latents)` ([B, D], streams in order)."""
    columns, start = {}, 0
    for name, t in latents.streams.items():
        size = math.prod(t.shape[1:])
        columns[name] = slice(start, start + size)
        start += size
    return columns


LossPart = Callable[[str, slice, Tensor], tuple[Tensor, dict[str, Tensor]]]


def routed_loss(part: LossPart, columns: Mapping[str, slice], advantages: LatentStreams) -> tuple[Tensor, dict[str, Tensor]]:
    """sum_s (D_s / D) part(s, columns_s, A_s): the loss of each stream with its own advantage,
    weighted by its share of the action's dimensions. Metrics: each part's, averaged with the same
    weights, and `policy/<stream>` (every stream's own loss)."""
    if set(columns) != set(advantages.names):
        raise ValueError(f"advantages for streams {list(advantages.names)} but the latents hold {list(columns)}")
    total = sum(c.stop - c.start for c in columns.values())
    loss, metrics = None, {}
    for name, cols in columns.items():
        w = (cols.stop - cols.start) / total
        part_loss, part_metrics = part(name, cols, advantages[name])
        loss = w * part_loss if loss is None else loss + w * part_loss
        for k, v in part_metrics.items():
            metrics[k] = w * v if k not in metrics else metrics[k] + w * v
        metrics[f"policy/{name}"] = part_loss.detach()
    return loss, metrics

"""Latents of one or several streams: a plain tensor, or `LatentStreams` (video and audio of one sample).

A model whose forward denoises several latents (LTX-2) uses `LatentStreams`, named tensors
sharing their leading dims; the functions here (`stack`, `index`, `select`, `flat`, ...) carry
either kind. A step over several streams is one action (`flow_sde.step_latents`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import torch
from torch import Tensor


@dataclass(frozen=True)
class LatentStreams:
    """Named latent tensors in a fixed order. Batched ones share their leading dims; one
    sample's (the engine's per-sample state) need not, since streams differ in rank and size."""

    streams: dict[str, Tensor]

    def __post_init__(self) -> None:
        if not self.streams:
            raise ValueError("LatentStreams needs at least one stream")

    def __getitem__(self, name: str) -> Tensor:
        return self.streams[name]

    @property
    def batch_size(self) -> int:
        sizes = {name: t.shape[0] for name, t in self.streams.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"latent streams disagree on the batch size: {sizes}")
        return next(iter(sizes.values()))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.streams)

    def map(self, fn) -> "LatentStreams":
        return LatentStreams({k: fn(v) for k, v in self.streams.items()})

    @property
    def device(self) -> torch.device:
        return next(iter(self.streams.values())).device

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.streams.values())).dtype


Latents = Union[Tensor, LatentStreams]
LatentShape = Union[tuple[int, ...], dict[str, tuple[int, ...]]]


def _apply(x: Latents, fn) -> Latents:
    return x.map(fn) if isinstance(x, LatentStreams) else fn(x)


def stack(items: Sequence[Latents], dim: int = 0) -> Latents:
    first = items[0]
    if isinstance(first, LatentStreams):
        return LatentStreams({k: torch.stack([it.streams[k] for it in items], dim) for k in first.streams})
    return torch.stack(list(items), dim)


def cat(items: Sequence[Latents], dim: int = 0) -> Latents:
    first = items[0]
    if isinstance(first, LatentStreams):
        return LatentStreams({k: torch.cat([it.streams[k] for it in items], dim) for k in first.streams})
    return torch.cat(list(items), dim)


def index(x: Latents, i: int, dim: int = 0) -> Latents:
    return _apply(x, lambda t: t.select(dim, i))


def take(x: Latents, rows: Tensor, cols: Tensor) -> Latents:
    return _apply(x, lambda t: t[rows, cols])


def select(x: Latents, idx: Tensor) -> Latents:
    return _apply(x, lambda t: t.index_select(0, idx.to(t.device)))


def to(x: Latents, device=None, dtype=None) -> Latents:
    return _apply(x, lambda t: t.to(device=device, dtype=dtype))


def clone(x: Latents) -> Latents:
    return _apply(x, lambda t: t.clone())


def detach(x: Latents) -> Latents:
    return _apply(x, lambda t: t.detach())


def flat(x: Latents) -> Tensor:
    """[B, D]: the streams flattened per sample and concatenated in stream order."""
    if isinstance(x, LatentStreams):
        return torch.cat([t.reshape(t.shape[0], -1) for t in x.streams.values()], dim=1)
    return x.reshape(x.shape[0], -1)


def unflat(values: Tensor, like: Latents) -> Latents:
    """`flat`'s inverse: `values` [B, D] cut and shaped like `like` (same batch size)."""
    if not isinstance(like, LatentStreams):
        return values.reshape(like.shape)
    sizes = [math.prod(t.shape[1:]) for t in like.streams.values()]
    if sum(sizes) != values.shape[1]:
        raise ValueError(f"unflat: {values.shape[1]} values per sample, the streams hold {sum(sizes)}")
    out, start = {}, 0
    for (name, t), size in zip(like.streams.items(), sizes):
        out[name] = values[:, start : start + size].reshape(t.shape)
        start += size
    return LatentStreams(out)


def shape_of(x: Latents) -> LatentShape:
    """The shape: a tuple, or {name: tuple} for streams (of one sample: `latent_shape`'s form)."""
    if isinstance(x, LatentStreams):
        return {k: tuple(t.shape) for k, t in x.streams.items()}
    return tuple(x.shape)


def randn(shape: LatentShape, generator: torch.Generator | None = None, dtype=torch.float32) -> Latents:
    """Standard normal latents of one sample's shape, on the generator's device; streams drawn in
    order from one generator."""
    device = None if generator is None else generator.device
    if isinstance(shape, dict):
        return LatentStreams({k: torch.randn(s, generator=generator, dtype=dtype, device=device) for k, s in shape.items()})
    return torch.randn(shape, generator=generator, dtype=dtype, device=device)


def numel_per_sample(shape: LatentShape) -> int:
    if isinstance(shape, dict):
        return sum(math.prod(s) for s in shape.values())
    return math.prod(shape)

"""`to_host(value)`: a worker's result with every tensor in host memory, before Ray carries it.

torch pickles a tensor with its device, so a CUDA result would land on the driver's device 0 (or
fail where the driver sees no GPU). The walk keeps every type (dataclasses, `LatentStreams`,
`Conditioning`, tuples, lists, dicts).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from omni_rl.algos.latent_streams import LatentStreams
from omni_rl.models.conditioning import Conditioning


def map_tensors(value: Any, fn) -> Any:
    """`value` with `fn` applied to every tensor it holds (module docstring: what is walked)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, LatentStreams):
        return value.map(fn)
    if isinstance(value, Conditioning):
        return Conditioning({k: fn(v) for k, v in value.tensors.items()}, dict(value.masks))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: map_tensors(getattr(value, f.name), fn) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    if isinstance(value, tuple):
        return tuple(map_tensors(v, fn) for v in value)
    if isinstance(value, list):
        return [map_tensors(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def to_host(value: Any) -> Any:
    """`value` with every tensor on the CPU (a tensor already there is kept, not copied)."""
    return map_tensors(value, lambda t: t if t.device.type == "cpu" else t.cpu())


__all__ = ["map_tensors", "to_host"]

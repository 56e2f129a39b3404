"""Per-device memory of a model's weights, gradients and optimizer state, as the engines hold them.

Pure arithmetic: `weight_memory` gives one rank's device and host bytes as `engine.fsdp2` and
`engine.local` hold them. Not counted: activations, gathered blocks, rollout tensors,
fragmentation, the device context.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable

import torch


@dataclass(frozen=True)
class TensorSpec:
    """One parameter as an engine holds it."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    trainable: bool
    sharded: bool  # in a module the engine wraps with fully_shard


@dataclass(frozen=True)
class WeightMemory:
    """Bytes one rank holds, on its device and in host memory."""

    frozen_weights: int
    trainable_weights: int
    gradients: int
    optimizer_state: int
    host_weights: int
    host_gradients: int
    host_optimizer_state: int

    @property
    def device_total(self) -> int:
        return self.frozen_weights + self.trainable_weights + self.gradients + self.optimizer_state

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "device_total": self.device_total}


def fsdp2_local_numel(shape: tuple[int, ...], world_size: int) -> int:
    """Elements of one rank's FSDP2 shard of a parameter of `shape` (dim 0 padded to a multiple
    of `world_size`; a 0-dim parameter is not split)."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size!r}: expected at least 1")
    if not shape:
        return 1
    return math.ceil(shape[0] / world_size) * math.prod(shape[1:])


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype, device="meta").element_size()


def weight_memory(
    tensors: Iterable[TensorSpec], world_size: int, param_offload: bool = False, optimizer_offload: bool = False
) -> WeightMemory:
    """One rank's bytes for `tensors` sharded over `world_size` ranks (dim-0 shards padded)."""
    frozen = trainable = grads = optim = host_weights = host_grads = host_optim = 0
    for t in tensors:
        numel = fsdp2_local_numel(t.shape, world_size) if t.sharded else math.prod(t.shape)
        size = numel * _bytes(t.dtype)
        offloaded = param_offload and t.sharded
        if not t.trainable:
            if offloaded:
                host_weights += size
            else:
                frozen += size
            continue
        step = _bytes(torch.float32)  # AdamW's `step`, a host scalar per parameter
        if offloaded:
            host_weights, host_grads, host_optim = host_weights + size, host_grads + size, host_optim + 2 * size + step
        else:
            trainable, grads = trainable + size, grads + size
            if optimizer_offload:
                host_optim += 2 * size + step
            else:
                optim, host_optim = optim + 2 * size, host_optim + step
    return WeightMemory(frozen, trainable, grads, optim, host_weights, host_grads, host_optim)

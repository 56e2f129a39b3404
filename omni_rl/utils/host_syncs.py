"""Counting host syncs on any device: `HostSyncCounter`, a `TorchDispatchMode` over the block.

It counts `aten._local_scalar_dense` / `aten.item` calls, so a CPU test shows where a loop would
stall a GPU. Left out: `.tolist()` / `.numpy()` of CPU tensors; host-resident tensors such as
Adam's `step` are counted unless `count_except` leaves them out.
"""
from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = ("aten._local_scalar_dense", "aten.item")


class HostSyncCounter(TorchDispatchMode):
    """`with HostSyncCounter() as syncs: ...`, then `syncs.count` (and `syncs.ops` by name)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.read: list[torch.Tensor] = []  # the tensor each counted op read

    @property
    def count(self) -> int:
        return sum(self.ops.values())

    def count_except(self, host_tensors) -> int:
        """The count without the reads of `host_tensors` (tensors that stay on the host beside an
        accelerator too, so that reading them waits for no device)."""
        skip = {id(t) for t in host_tensors}
        return sum(1 for t in self.read if id(t) not in skip)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = f"aten.{func.overloadpacket.__name__}"
        if name in SYNC_OPS:
            self.ops[name] += 1
            self.read.append(args[0])
        return func(*args, **(kwargs or {}))

"""Counting host syncs on any device: `HostSyncCounter`, a `TorchDispatchMode` over the block.

A device tensor becomes a Python number through one op, `aten._local_scalar_dense` (`.item()`,
`float(t)`, `bool(t)`, `if t:`), or `aten.item` on the way to it; on an accelerator each one
waits for every kernel queued before it. Counting them on a CPU shows, without a GPU, where a
loop would stall one: the rollout's denoising iterations must count 0, the update a small
constant per mini-batch (tests/omni_rl/rollout/test_host_syncs.py, tests/omni_rl/engine/...).
`torch.cuda.set_sync_debug_mode("error")` is the same check on a CUDA device, where it also
catches blocking copies (benchmarks/gpu_acceptance.py runs it).

Left out: `.tolist()` and `.numpy()` of CPU tensors (no device involved) are not counted. A
tensor that lives on the host even beside an accelerator (an optimizer's `step` count, which
torch's Adam reads each step) is counted on a CPU; `count_except` leaves such tensors out.
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

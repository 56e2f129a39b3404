"""One forward (and backward) of a weightless network at full size, on fake tensors: FLOPs and
peak memory without allocating or computing anything.

`materialize(module, mode)` gives every parameter and buffer of a meta-device module a tensor of
the same shape, dtype and `requires_grad` (fake ones under a `FakeTensorMode`, real uninitialised
CPU ones without: the real-tensor check of the planner runs the same code). `trace(module,
kwargs, backward)` then runs the module under torch's FLOP counter
(`torch.utils.flop_counter.FlopCounterMode`) and a live-bytes tracker (`LiveBytes`, a dispatch
mode: torch's `MemTracker` refuses frozen parameters), and returns:

- `flops`: the counter's total (matmuls and attention; elementwise ops count 0, as in torch);
- `activation_bytes`: the peak bytes of tensors the pass created and held at once (saved
  activations, temporaries, the inputs), less the trainable parameters' gradients (planned per
  rank by `memory.py`); the parameters themselves exist before the pass and are not in it.

Gradient checkpointing is whatever the module was set up with (the adapter's own
`enable_checkpointing`), so its recomputation is traced as it runs. The model is traced whole, on
one device: FSDP2's all-gathered blocks and communication buffers are not in these numbers.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class Trace:
    flops: int
    activation_bytes: int


def materialize(module: nn.Module, fake: bool) -> None:
    """Replace every meta tensor of `module` by an unallocated-looking one in the current mode
    (see the module docstring); tied parameters stay tied."""
    done: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for name, t in list(table.items()):
                if t is None or (not t.is_meta and not fake):
                    continue
                if id(t) not in done:
                    new = torch.empty(t.shape, dtype=t.dtype, device="cpu")
                    if isinstance(t, nn.Parameter):
                        new = nn.Parameter(new, requires_grad=t.requires_grad)
                    done[id(t)] = new
                table[name] = done[id(t)]
        # Plain tensor attributes (RoPE tables some diffusers models keep outside their buffers).
        for name, t in list(vars(sub).items()):
            if isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter) and (t.is_meta or fake):
                setattr(sub, name, torch.empty(t.shape, dtype=t.dtype, device="cpu"))


def fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=False)


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the tensors alive during a pass that the pass itself created: every op's
    output storages are counted once from their creation until their last reference goes
    (a weak reference's callback). torch's `MemTracker` does the same but, in torch 2.14, hooks
    every parameter for gradients and so refuses a module with frozen parameters (LoRA)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen: dict[int, Any] = {}

    def _drop(self, key: int, size: int) -> None:
        self._seen.pop(key, None)
        self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key = st._cdata
                if key in self._seen:
                    continue
                size = st.nbytes()
                self._seen[key] = weakref.ref(st, lambda _, k=key, n=size: self._drop(k, n))
                self.live += size
                self.peak = max(self.peak, self.live)
        return out


def trace(module: nn.Module, make_inputs: Callable[[], dict[str, Any]], backward: bool) -> Trace:
    """FLOPs and peak activation bytes of `module(**make_inputs())` (+ backward of its first
    output's mean when `backward`); call inside the mode `materialize` ran in. Gradients of the
    trainable parameters count in the peak at the moment they exist; they are removed after."""
    from torch.utils.flop_counter import FlopCounterMode

    grad = contextlib.nullcontext() if backward else torch.no_grad()
    live = LiveBytes()
    with FlopCounterMode(display=False) as flops, grad:
        with live:
            out = module(**make_inputs())
            first = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", None)
            if first is None:
                first = out.sample if hasattr(out, "sample") else out
            if backward:
                first.float().mean().backward()
            del out, first
    grads = sum(p.grad.untyped_storage().nbytes() for p in module.parameters() if p.grad is not None)
    for p in module.parameters():
        p.grad = None
    return Trace(int(flops.get_total_flops()), int(live.peak - grads))

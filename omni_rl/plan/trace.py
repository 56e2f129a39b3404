"""One forward (and backward) of a weightless network at full size, on fake tensors: FLOPs and
peak memory without allocating or computing anything.

`materialize` gives meta parameters fake tensors; `trace` runs the module under `LiveBytes`,
which counts FLOPs, peak live activation bytes and weight reads for `roofline.py` (torch's
`FlopCounterMode` would keep outputs alive, undoing checkpointing). Not counted: FSDP2's
gathered blocks and buffers.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


@dataclass(frozen=True)
class Trace:
    flops: int
    activation_bytes: int
    weight_read_bytes: int = 0
    expert_read_bytes: int = 0
    # A text rollout's decoding, step by step (`text_steps.DecodeReads`); None for one forward.
    decode: Any = None


def _grouped_mm_flops(a, b, *args, out_val=None, **kwargs) -> int:
    """`aten._grouped_mm` (a MoE's experts, each token through its own expert): 2 x the
    multiply-adds. Two 2-D operands contract over their shared ragged dimension (the weight
    gradient: [K, M] x [M, N] -> [G, K, N]); otherwise each output element sums over `a`'s last."""
    if a.dim() == 2 and b.dim() == 2:
        return 2 * a.shape[0] * a.shape[1] * b.shape[1]
    return 2 * out_val.numel() * a.shape[-1]


# Ops torch's `flop_registry` (2.14) has no formula for.
EXTRA_FLOPS = {torch.ops.aten._grouped_mm: _grouped_mm_flops}


def materialize(module: nn.Module, fake: bool) -> None:
    """Replace every meta tensor of `module` by an unallocated-looking one in the current mode
    (for tracing); tied parameters stay tied."""
    done: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for name, t in list(table.items()):
                if t is None or not t.is_meta:
                    continue
                if id(t) not in done:
                    new = torch.empty(t.shape, dtype=t.dtype, device="cpu")
                    if isinstance(t, nn.Parameter):
                        new = nn.Parameter(new, requires_grad=t.requires_grad)
                    done[id(t)] = new
                table[name] = done[id(t)]
        # Plain tensor attributes (RoPE tables some diffusers models keep outside their buffers).
        for name, t in list(vars(sub).items()):
            if isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter) and t.is_meta:
                setattr(sub, name, torch.empty(t.shape, dtype=t.dtype, device="cpu"))


def fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=False)


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the storages a pass creates and holds at once, and its FLOPs.

    Every op's output storages are kept with their size; after each op, one whose use count
    (`torch._C._storage_Use_Count`) has fallen to our reference is dead and dropped. Use counts see
    every holder (autograd's saved tensors, views), which a weak reference would not.
    """

    def __init__(self, module: nn.Module | None = None):
        super().__init__()
        self.live = self.peak = self.flops = 0
        self._held: dict[int, tuple[Any, int]] = {}
        # The module's own tensors exist before the pass: an op that returns a view of one
        # (`weight.t()`, `detach`) allocates nothing.
        self._skip = {t.untyped_storage()._cdata for t in (*module.parameters(), *module.buffers())} if module is not None else set()
        # {storage key: (bytes, is an expert's)} of the module's parameters, for the bytes each op reads.
        self._params = {p.untyped_storage()._cdata: (p.untyped_storage().nbytes(), "experts" in name.split("."))
                        for name, p in module.named_parameters()} if module is not None else {}
        self.weight_read = self.expert_read = 0

    def not_activation(self, tensor: torch.Tensor) -> None:
        """Stop counting `tensor`'s storage (a parameter's gradient: planned per rank apart)."""
        key = tensor.untyped_storage()._cdata
        self._skip.add(key)
        if key in self._held:
            self.live -= self._held.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._params and not func.is_view and func.namespace != "prim":  # prim: metadata (device, strides)
            self._count_reads(func, args, kwargs, out)
        count = flop_registry.get(func._overloadpacket) or EXTRA_FLOPS.get(func._overloadpacket)
        if count is not None:
            self.flops += count(*args, **kwargs, out_val=out)
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key = st._cdata
                if key not in self._held and key not in self._skip:
                    self._held[key] = (st, st.nbytes())
                    self.live += st.nbytes()
        # `live` only grows between scans, so it bounds the true figure from above: a scan for
        # the dead is needed only when that bound passes the peak (the peak stays exact).
        if self.live > self.peak:
            use_count = torch._C._storage_Use_Count
            dead = [k for k, (st, _) in self._held.items() if use_count(st._cdata) <= 1]
            for k in dead:
                self.live -= self._held.pop(k)[1]
            self.peak = max(self.peak, self.live)
        return out


    def _count_reads(self, func, args, kwargs, out) -> None:
        seen = set()
        for t in torch.utils._pytree.tree_leaves((args, kwargs)):
            if not isinstance(t, torch.Tensor):
                continue
            key = t.untyped_storage()._cdata
            if key in seen or key not in self._params:
                continue
            seen.add(key)
            nbytes, expert = self._params[key]
            if func is torch.ops.aten.embedding.default:
                nbytes = out.numel() * out.element_size()  # the looked-up rows, not the table
            if expert:
                self.expert_read += nbytes
            else:
                self.weight_read += nbytes


def trace(module: nn.Module, make_inputs: Callable[[], dict[str, Any]], backward: bool) -> Trace:
    """FLOPs and peak activation bytes of `module(**make_inputs())` (+ backward of its first
    output's mean, or of the sum of their means for a list of per-sample outputs, when `backward`); call inside the mode `materialize` ran in. The trainable
    parameters' gradients are not activations (`memory.py` plans them per rank): each leaves the
    count as it is accumulated."""
    grad = contextlib.nullcontext() if backward else torch.no_grad()
    live = LiveBytes(module)
    hooks = [p.register_post_accumulate_grad_hook(lambda p: live.not_activation(p.grad))
             for p in module.parameters() if p.requires_grad]
    try:
        with grad, live:
            out = module(**make_inputs())
            first = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", None)
            if first is None:
                first = out.sample if hasattr(out, "sample") else out
            if backward:
                # A list of per-sample outputs (Z-Image's transformer returns one tensor a sample).
                parts = first if isinstance(first, (list, tuple)) else [first]
                sum(part.float().mean() for part in parts).backward()
            del out, first
    finally:
        for hook in hooks:
            hook.remove()
    for p in module.parameters():
        p.grad = None
    return Trace(int(live.flops), int(live.peak), int(live.weight_read), int(live.expert_read))

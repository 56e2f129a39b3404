"""The one place that names devices: picks cuda, npu (Ascend, via torch_npu) or cpu.

Everything else receives a `torch.device` from here and never spells a device type itself.
"""
from __future__ import annotations

import importlib.util

import torch


def npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch_npu  # noqa: F401  (registers the "npu" device type with torch)

    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


def pick_device(name: str = "auto") -> torch.device:
    """`auto` -> cuda, else npu, else cpu; an explicit name must be usable here."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if npu_available():
            return torch.device("npu")
        return torch.device("cpu")
    kind = name.split(":")[0]
    usable = {"cpu": True, "cuda": torch.cuda.is_available(), "npu": kind == "npu" and npu_available()}
    if kind not in usable:
        raise ValueError(f"trainer.device={name!r}: expected auto, cpu, cuda[:N] or npu[:N]")
    if not usable[kind]:
        raise ValueError(f"trainer.device={name!r} but no {kind} device is available here; use trainer.device=auto or cpu")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels (for honest timings)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize(device)

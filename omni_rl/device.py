"""The one place that names devices: picks cuda, npu (Ascend, via torch_npu) or cpu.

Everything else receives a `torch.device` from here and never spells a device type itself.
"""
from __future__ import annotations

import importlib.util
from typing import Optional

import torch

from omni_rl.errors import OmniConfigError


def npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch_npu  # noqa: F401  (registers the "npu" device type with torch)

    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


class DeviceError(OmniConfigError):
    """`trainer.device` names a device this machine does not have."""


# How messages name each device type.
_DEVICE_NAMES = {"cuda": "CUDA", "npu": "NPU (Ascend)"}


def device_count(kind: str) -> int:
    """Devices of type `kind` (cuda, npu) this machine has; 1 for the CPU."""
    if kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "npu":
        return torch.npu.device_count() if npu_available() else 0
    return 1


def pick_device(name: str = "auto") -> torch.device:
    """`auto` -> cuda, else npu, else cpu; an explicit name must be usable here."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if npu_available():
            return torch.device("npu")
        return torch.device("cpu")
    kind, colon, index = name.partition(":")
    if kind not in ("cpu", "cuda", "npu") or (colon and not index.isdigit()):
        raise DeviceError(f"trainer.device={name!r}: expected auto, cpu, cuda[:N] or npu[:N]")
    if kind == "cpu":
        return torch.device(name)
    count = device_count(kind)
    if count == 0:
        raise DeviceError(
            f"trainer.device={name!r} but no {_DEVICE_NAMES[kind]} device is available here; "
            f"use trainer.device=auto (picks what this machine has) or trainer.device=cpu"
        )
    if index and int(index) >= count:
        raise DeviceError(
            f"trainer.device={name!r} but this machine has {count} {_DEVICE_NAMES[kind]} device(s), "
            f"{kind}:0 to {kind}:{count - 1}; use one of those or trainer.device=auto"
        )
    return torch.device(name)


def check_trainer_device(name: str, backend: str = "local") -> None:
    """Raise `DeviceError` before anything loads if `trainer.device=name` cannot work.

    With trainer.backend=local this process is the device's user, so the device must be here.
    With Ray the workers use it, and the driver may be a CPU head node: nothing to check here."""
    if backend == "local":
        pick_device(name)


def device_memory(device: torch.device) -> Optional[int]:
    """The total memory of accelerator `device` in bytes; None for the CPU and the meta device."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "npu":
        return torch.npu.get_device_properties(device).total_memory
    return None


def runs_on_cpu(name: str) -> bool:
    """Whether `trainer.device=name` puts the model on this machine's CPU (auto: no accelerator
    here). Asks no accelerator more than whether there is one."""
    return name.startswith("cpu") or (name == "auto" and pick_device("auto").type == "cpu")


def weightless_device() -> torch.device:
    """Where a model is described but not stored: the meta device (names, shapes, dtypes; no
    memory). The Ray driver builds its view of the model there; the workers hold the weights."""
    return torch.device("meta")


def is_weightless(device: torch.device) -> bool:
    return device.type == "meta"


def bind_device(device: torch.device) -> None:
    """Make `device` this process's current accelerator (a Ray worker does it once, before its
    process group starts: NCCL / HCCL use the current device)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type == "npu":
        torch.npu.set_device(device)


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels (for honest timings)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize(device)


# torch.distributed backend per device type: gloo on CPUs, NCCL on CUDA GPUs, HCCL on Ascend NPUs.
_DIST_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


def dist_backend(device: torch.device | str) -> str:
    """The torch.distributed backend for process groups on `device` (a device or its type name)."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    if kind not in _DIST_BACKENDS:
        raise ValueError(f"device {device}: no process-group backend known; expected one of {sorted(_DIST_BACKENDS)}")
    return _DIST_BACKENDS[kind]


def ray_device_resource(name: str = "auto") -> str | None:
    """The Ray resource one worker reserves for its device: "GPU", "NPU", or None (CPU only).

    Resolved on the driver from `trainer.device`, which may have no accelerator itself (a CPU
    head node): an explicit cuda / npu is trusted; auto looks at this machine."""
    kind = name.split(":")[0]
    if kind == "auto":
        kind = pick_device("auto").type
    return {"cuda": "GPU", "npu": "NPU"}.get(kind)


def worker_device(name: str = "auto") -> torch.device:
    """A Ray worker's device: Ray exposes the worker's accelerator as index 0
    (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES), so an index in `name` is dropped."""
    device = pick_device(name.split(":")[0])
    return device if device.type == "cpu" else torch.device(device.type, 0)

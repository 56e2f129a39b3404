"""Device kinds a plan can be judged against: memory and peak dense bf16 throughput.

Peak figures are the vendors' dense (no sparsity) bf16 tensor-core numbers for the SXM/OAM
parts; a real step reaches a fraction of them (model FLOPs utilisation), so a time computed from
them is a best case. Sources:

- H100 SXM5 80 GB: NVIDIA H100 Tensor Core GPU datasheet, BF16 1,979 TFLOPS "with sparsity",
  so 989.4 dense;
- H800 SXM5 80 GB: NVIDIA H800 product brief: the H100's compute (989 dense bf16 TFLOPS), with
  reduced NVLink bandwidth (400 GB/s), which a FLOP bound does not see;
- H200 SXM 141 GB: NVIDIA H200 datasheet, BF16 1,979 TFLOPS with sparsity, 989 dense;
- Ascend 910B 64 GB: Huawei does not publish a bf16 datasheet figure for the 910B; 313 TFLOPS is
  the fp16 figure third-party listings give for the 910B3 (treat it as approximate).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from omni_rl.errors import ConfigError


@dataclass(frozen=True)
class DeviceKind:
    name: str
    memory_gb: float  # GB = 1e9 bytes, as vendors state it
    bf16_tflops: float


DEVICE_KINDS = {d.name: d for d in (
    DeviceKind("H100", 80, 989.4),
    DeviceKind("H800", 80, 989.4),
    DeviceKind("H200", 141, 989.4),
    DeviceKind("Ascend910B", 64, 313.0),
)}
DEFAULT_DEVICE_KIND = "H800"


def device_kind(name: str) -> DeviceKind:
    """The named kind, or a one-line ConfigError listing the known ones."""
    if name not in DEVICE_KINDS:
        raise ConfigError(f"--device-kind={name!r}: unknown device kind; expected one of {', '.join(DEVICE_KINDS)}")
    return DEVICE_KINDS[name]


def device_memory_bytes(kind: DeviceKind, memory_gb: float | None) -> int:
    """The memory a plan must fit: `--device-memory GB` when given (> 0, finite), else the kind's."""
    if memory_gb is None:
        return int(kind.memory_gb * 1e9)
    if not 0 < memory_gb < math.inf:
        raise ConfigError(f"--device-memory={memory_gb!r}: expected a positive number of GB (finite, e.g. 80)")
    return int(memory_gb * 1e9)

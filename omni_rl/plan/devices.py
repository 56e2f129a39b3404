"""Device kinds a plan can be judged against: memory, peak dense bf16 throughput and memory bandwidth.

Peaks are the vendors' dense (no sparsity) bf16 figures for the SXM/OAM parts, so a time from
them is a best case: H100 SXM5, H800 and H200 989.4 TFLOPS (datasheets give 1,979 with sparsity; the
H800 differs in NVLink only), Ascend 910B 313 (the fp16 figure third-party listings
give for the 910B3; approximate, Huawei publishes no bf16 figure).
Memory bandwidth, the same datasheets: H100 SXM5 and H800 3.35 TB/s, H200 4.8 TB/s, Ascend 910B
1.6 TB/s (HBM2e; third-party listings, approximate).
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
    memory_tbps: float  # TB/s = 1e12 bytes a second


DEVICE_KINDS = {d.name: d for d in (
    DeviceKind("H100", 80, 989.4, 3.35),
    DeviceKind("H800", 80, 989.4, 3.35),
    DeviceKind("H200", 141, 989.4, 4.8),
    DeviceKind("Ascend910B", 64, 313.0, 1.6),
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

"""The driver process in a plan: `plan_driver(...)`, what the process `main_omni.py` runs holds.

Counted: the tensors its weightless build materialised (a Ray driver should hold none; a local
driver's weights are the device's), every sample's decoded pixels (uint8 on the host for the
rewards), the step's trajectories where they come back to it (Ray, or
`trajectory_device=cpu`), and reward models scored on the host.

Not counted: decoded waveforms, the dataset, Python and its libraries, a rollout server's own
process, Ray's object store copies.
"""
from __future__ import annotations

from typing import Any

import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.models.limits import decoded_sample_bytes


def materialised_bytes(modules) -> int:
    """Bytes of every tensor of `modules` not on the meta device, each storage once."""
    seen: set[int] = set()
    total = 0
    for root in modules:
        for sub in root.modules():
            tensors = [*sub._parameters.values(), *sub._buffers.values(),
                       *(v for v in vars(sub).values() if isinstance(v, torch.Tensor))]
            for t in tensors:
                if t is None or t.is_meta or id(t) in seen:
                    continue
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


def trajectories_on_host(cfg: OmniConfig) -> bool:
    """Whether the rollout engine puts finished trajectories in host memory
    (`rollout.backend_options.trajectory_device=cpu`; a backend without the option keeps them on the device)."""
    from omni_rl.rollout.backends import NativeOptions

    options = cfg.rollout.backend_options
    return isinstance(options, NativeOptions) and options.trajectory_device == "cpu"


def media_bytes_per_sample(cfg: OmniConfig, pixels: bool) -> int:
    """A decoded image or video's uint8 pixels (frames x H x W x 3); 0 for a model that makes
    none (text; speech, whose waveforms are not counted)."""
    if not pixels:
        return 0
    r = cfg.rollout.sampling_options
    # The load-time step check counts the same bytes (`omni_rl.models.limits`).
    return decoded_sample_bytes(r.height, r.width, r.num_frames)


def plan_driver(cfg: OmniConfig, materialised: int, samples: int, trajectory_per_sample: int, pixels: bool,
                rewards: dict[str, Any]) -> dict[str, Any]:
    """The driver's host memory (module docstring) as a JSON-able dict; `materialised` is
    `materialised_bytes` of the weightless build, taken before any trace."""
    ray = cfg.trainer.backend == "ray"
    on_host = ray or trajectories_on_host(cfg)
    parts = {
        "policy_weights": materialised if ray else 0,
        "trajectories": samples * trajectory_per_sample if on_host else 0,
        "decoded_samples": samples * media_bytes_per_sample(cfg, pixels),
        "reward_models": sum(m["bytes"] for m in rewards["models"] if m["where"] == "host"),
    }
    return {"backend": cfg.trainer.backend, "weightless_build": ray, "trajectories_on_host": on_host,
            "bytes": parts, "total": sum(parts.values())}


__all__ = ["plan_driver", "materialised_bytes", "trajectories_on_host"]

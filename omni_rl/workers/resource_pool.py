"""`ResourcePool`: `nnodes x devices_per_node` worker slots reserved as one Ray placement group.

One bundle per worker: one CPU, plus one GPU (CUDA) or NPU (Ascend) when the workers have an
accelerator. On a CPU machine a worker is one CPU. With one node the bundles are packed
strictly onto it; with several, Ray packs them node by node (`PACK`), so a cluster of
`nnodes` machines with `devices_per_node` devices each is filled in order.
"""
from __future__ import annotations

from typing import Any


class ResourcePool:
    def __init__(self, nnodes: int, devices_per_node: int, device_resource: str | None = None):
        if nnodes < 1 or devices_per_node < 1:
            raise ValueError(
                f"nnodes={nnodes}, devices_per_node={devices_per_node}: expected both >= 1 (trainer.backend_options.nnodes, "
                f"trainer.backend_options.devices_per_node)"
            )
        if device_resource not in (None, "GPU", "NPU"):
            raise ValueError(f"device_resource={device_resource!r}: expected None (CPU), 'GPU' or 'NPU'")
        self.nnodes = nnodes
        self.devices_per_node = devices_per_node
        self.device_resource = device_resource
        self.placement_group: Any = None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.devices_per_node

    def bundle(self) -> dict[str, float]:
        b = {"CPU": 1.0}
        if self.device_resource:
            b[self.device_resource] = 1.0
        return b

    def actor_options(self) -> dict[str, Any]:
        """Resources one worker actor asks for inside its bundle."""
        if self.device_resource == "GPU":
            return {"num_cpus": 1, "num_gpus": 1}
        if self.device_resource == "NPU":
            return {"num_cpus": 1, "resources": {"NPU": 1}}
        return {"num_cpus": 1}

    def reserve(self, timeout_s: float) -> Any:
        """Create the placement group and wait until Ray has placed it."""
        import ray
        from ray.util.placement_group import placement_group

        strategy = "STRICT_PACK" if self.nnodes == 1 else "PACK"
        self.placement_group = placement_group([self.bundle() for _ in range(self.world_size)], strategy=strategy)
        ready, _ = ray.wait([self.placement_group.ready()], timeout=timeout_s)
        if not ready:
            have = ray.cluster_resources()
            self.release()
            raise RuntimeError(
                f"the resource pool of {self.world_size} workers (trainer.backend_options.nnodes={self.nnodes} x "
                f"trainer.backend_options.devices_per_node={self.devices_per_node}, each {self.bundle()}) was not placed within "
                f"{timeout_s:.0f} s; the Ray cluster has {have}. Lower trainer.backend_options.devices_per_node / trainer.backend_options.nnodes, "
                f"or start Ray with more resources"
            )
        return self.placement_group

    def scheduling(self, rank: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=self.placement_group, placement_group_bundle_index=rank)

    def release(self) -> None:
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.placement_group)
            except Exception:  # noqa: BLE001  (Ray already gone: nothing left to release)
                pass
            self.placement_group = None

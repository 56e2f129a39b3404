"""Ray worker groups (single controller): a resource pool, a group of hybrid workers, errors.

The driver stays one plain loop and hands programs (module-level functions) and each rank's
share of the data to `WorkerGroup.run`; the programs (`programs.py`) install each rank's
`WorkerState` and call the families' actor half, knowing no algorithm. `ray_rollout` is the
driver's rollout engine over the group; `ray_cluster.connect_ray` starts or joins Ray.
"""
from omni_rl.workers.errors import WorkerFailedError
from omni_rl.workers.resource_pool import ResourcePool
from omni_rl.workers.worker_group import WorkerGroup

__all__ = ["ResourcePool", "WorkerFailedError", "WorkerGroup"]

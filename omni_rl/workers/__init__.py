"""Ray worker groups (single controller): a resource pool, a group of hybrid workers, errors.

The driver stays one plain loop; it hands a program (a module-level function) and each rank's
share of the data to `WorkerGroup.run`, which calls it on every worker and gathers the results
in rank order. What a worker holds (actor engine, rollout engine, reference) is installed by
the programs in `programs.py` (a typed `WorkerState` per rank); they call the model families'
actor half and the update loop, and know no algorithm themselves. `ray_rollout.RayRolloutEngine`
is the driver's rollout engine over a worker group; `ray_cluster.connect_ray` starts or joins Ray.
"""
from omni_rl.workers.errors import WorkerFailedError
from omni_rl.workers.resource_pool import ResourcePool
from omni_rl.workers.worker_group import WorkerGroup

__all__ = ["ResourcePool", "WorkerFailedError", "WorkerGroup"]

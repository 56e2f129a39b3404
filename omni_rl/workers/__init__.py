"""Ray worker groups (single controller): a resource pool, a group of hybrid workers, errors.

The driver stays one plain loop; it hands a program (a module-level function) and each rank's
share of the data to `WorkerGroup.run`, which calls it on every worker and gathers the results
in rank order. What a worker holds (actor engine, rollout engine, reference) is installed by
the trainer's programs (`omni_rl.trainer.distributed`); this package knows no algorithm.
"""
from omni_rl.workers.errors import WorkerFailedError
from omni_rl.workers.resource_pool import ResourcePool
from omni_rl.workers.worker_group import WorkerGroup

__all__ = ["ResourcePool", "WorkerFailedError", "WorkerGroup"]

"""`connect_ray`: start a local Ray or join a cluster, sized for the run's worker slots."""
from __future__ import annotations

import math
import os
from typing import Optional

from omni_rl.config.schema import OmniConfig
from omni_rl.families.teachers import pooled_teachers

# Ray's setting of its workers' niceness (read when the local Ray starts).
WORKER_NICENESS_ENV = "RAY_worker_niceness"


def connect_ray(cfg: OmniConfig, address: Optional[str] = None, world: int = 0) -> bool:
    """`ray.init()`: a local Ray by default, `address` (the ray backend's `ray_address`) to join a
    cluster; `world` training workers (0 without the ray backend). Returns whether this call
    started it (then its caller shuts it down at the end)."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
    else:
        # One CPU per worker slot at least, and the reward workers' CPUs, even on a small machine
        # (the workers then share cores; an unsatisfiable request would wait forever).
        workers = cfg.reward.worker_options
        rewards = math.ceil(workers.num_workers * workers.num_cpus)
        # And one CPU per actor of a teacher's pool (placement=pool).
        pools = sum(t.pool_workers for t in pooled_teachers(cfg))
        init_local_ray(max(os.cpu_count() or 1, world + rewards + pools), log_to_driver=True)
    return True


def init_local_ray(num_cpus: int, **kwargs) -> None:
    """Start a local Ray whose workers run at normal priority.

    Ray starts workers at nice 15, as background tasks; here they are the job itself (the actor,
    the rollout, the reward models), and beside any busy process at nice 0 they would starve
    until their deadlines fire (seen: the Ray tests stalled for minutes beside two CPU hogs)."""
    import ray

    os.environ.setdefault(WORKER_NICENESS_ENV, "0")
    ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)

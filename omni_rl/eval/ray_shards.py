"""`--eval-workers N`: one evaluation spread over N Ray workers, each a shard of the rows.

Worker i runs `run_eval` on `--shard i/N` in the same output folder. The driver checks the
inputs first (`prepare`), shows one progress bar, and writes results.json when all are done; a
failing worker stops the evaluation, and the rows recorded stay for a rerun. Ray starts locally
unless `trainer.backend_options.ray_address` names a cluster.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Optional

from omni_rl.eval.job import EvalInputError, EvalRequest, prepare, run_eval
from omni_rl.eval.store import done_rows


def _shard(cfg, request: EvalRequest) -> None:
    run_eval(cfg, request, progress=False)


def run_on_ray(cfg, request: EvalRequest, workers: int, progress: bool = True) -> Optional[dict[str, Any]]:
    if workers < 1:
        raise EvalInputError(f"--eval-workers {workers}: expected an int >= 1 (Ray workers, one shard each)")
    if request.shard != (0, 1):
        raise EvalInputError("--eval-workers splits the rows itself: drop --shard")
    job = prepare(cfg, request)  # every input checked, and the folder claimed, before Ray starts
    request = dataclasses.replace(request, out=str(job.out))
    import ray
    import torch
    from tqdm import tqdm

    from omni_rl.trainer.ray_actors import RayOptions
    from omni_rl.workers.ray_cluster import init_local_ray

    options = cfg.trainer.backend_options
    address = options.ray_address if isinstance(options, RayOptions) else None
    owns = not ray.is_initialized()
    if owns:
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=True)
        else:
            init_local_ray(max(os.cpu_count() or 1, workers), log_to_driver=True)
    try:
        gpus = 1 if torch.cuda.is_available() or ray.cluster_resources().get("GPU", 0) >= workers else 0
        # A worker that dies (not one that raises) is started again: its shard skips the rows it recorded.
        task = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=2, retry_exceptions=False)(_shard)
        pending = [task.remote(cfg, dataclasses.replace(request, shard=(i, workers))) for i in range(workers)]
        rows = len(job.items)
        bar = tqdm(total=rows, initial=len(done_rows(job.out)), desc=f"eval {job.benchmark.name} on {workers} workers",
                   unit="prompt", disable=not progress, file=sys.stderr)
        try:
            while pending:
                finished, pending = ray.wait(pending, num_returns=1, timeout=2.0)
                for ref in finished:
                    _get(ray, ref)
                bar.update(len(done_rows(job.out)) - bar.n)
        finally:
            bar.close()
    finally:
        if owns:
            ray.shutdown()
    return run_eval(cfg, request, progress=False)  # every row recorded: the figures, as a whole run writes them


def _get(ray, ref) -> None:
    """A worker's result; its own error (a config or run error) rather than Ray's wrapper."""
    try:
        ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, BaseException):
            raise err.cause from None
        raise

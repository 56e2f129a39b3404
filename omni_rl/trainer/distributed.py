"""The Ray backend of the trainer (`trainer.backend=ray`): the same loop, its stages on workers.

`RayWorkers` is what `PPOTrainer` talks to when the backend is ray. It starts (or joins) Ray,
reserves `trainer.nnodes x trainer.devices_per_node` worker slots, and starts one
`HybridWorker` per slot, each rank r of a torch.distributed group of N, holding:

- the actor: the model, same seed as one process would use, sharded with `FSDP2Engine`;
- the reference policy: the actor with LoRA disabled (as in one process);
- the rollout engine: the family's native engine over a separate, unsharded copy of the model,
  synced from the sharded actor after every update: only the LoRA tensors when LoRA is on (the
  fast path), otherwise the full weights gathered from the shards in buckets of
  `trainer.weight_sync_bucket_mb`. (A copy, rather than un-sharding the actor for generation,
  keeps the sharded actor untouched between updates; on GPUs the rollout engine is vLLM-Omni
  with its own weights anyway.)

How a step maps onto ranks (the driver splits batches and gathers them back; the loop only sees
whole batches):

- rollout: the stage builds its requests as in one process; `RayRolloutEngine`, standing in for
  the stage's engine, sends rank r the r-th contiguous shard in chunks of one engine batch and
  returns the results in request order. Requests are seeded per sample, so which rank samples a
  request does not change it.
- rewards and advantages: on the driver (or reward workers); a finished chunk's samples go to
  the reward scorer while the workers sample the next chunks (`scored_rollout`, both families).
- old log-probs: rank r scores the r-th shard of the batch.
- update: for every mini-batch (the same shuffle as one process), rank r takes the r-th equal
  share, in whole micro-batches, and scales its loss by 1 / (chunks * its micro-batches per
  mini-batch). FSDP averages gradients over ranks, so the update equals one process's on the
  whole mini-batch (validate.py requires mini_batch_size % (workers * micro_batch_size) == 0).
- checkpoints: each rank writes its shards (torch.distributed.checkpoint) into the checkpoint
  folder's `sharded/`, which all ranks must see (one machine, or a shared filesystem); rank 0
  writes the LoRA / full export from its rollout copy (synced with the actor after every update,
  so it holds the trained weights), and the driver adds `trainer_state.pt` (step, RNG).
  `export_sharded_checkpoint` writes that export again from a sharded checkpoint alone.

The driver holds no weights: its model is built on the meta device (`weightless_device`), with
the tokenizer, processor and config it needs to build requests (text prompts are tokenised
there) and nothing else; the final export is written by rank 0 too. Left out: separate
(non-colocated) actor and rollout pools.
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.workers import ResourcePool, WorkerFailedError, WorkerGroup
from omni_rl.trainer.ppo_update import run_update, summarize
from omni_rl.workers.worker_group import split_evenly

log = logging.getLogger(__name__)

SHARDED_DIR = "sharded"

__all__ = ["RayRolloutEngine", "RayWorkers", "WorkerFailedError", "export_sharded_checkpoint"]


# --- programs: run on every worker as fn(worker, *args) ------------------------------------
def build_hybrid(worker, cfg: OmniConfig) -> None:
    """Install the actor (FSDP2), its reference, and the rollout engine on its own model copy."""
    from omni_rl.engine.fsdp2 import FSDP2Engine
    from omni_rl.models.factory import build_model
    from omni_rl.trainer.ppo_trainer import STAGES

    t = cfg.trainer
    torch.manual_seed(t.seed)  # the same initial weights (and LoRA init) as one process
    model = build_model(cfg.model, worker.device, tuple(cfg.plugins))
    train_stage = STAGES[model.family](cfg, model)
    train_stage.close()  # only its actor is used; sampling happens on the rollout copy
    engine = FSDP2Engine(model, cfg.optim, t.param_offload, t.optimizer_offload)
    rollout_model = build_model(cfg.model, worker.device, tuple(cfg.plugins))
    worker.state.cfg = cfg
    worker.state.model = model
    worker.state.engine = engine
    worker.state.actor = train_stage.actor
    worker.state.rollout_model = rollout_model
    worker.state.rollout = STAGES[model.family](cfg, rollout_model)
    sync_rollout(worker, 0)


def sync_rollout(worker, version: int) -> None:
    """Sharded actor -> rollout copy: LoRA tensors only, or the full weights bucket by bucket."""
    s = worker.state
    for bucket in s.engine.trainable_buckets(s.cfg.trainer.weight_sync_bucket_mb << 20):
        s.rollout_model.load_named_tensors(bucket)
    s.rollout.engine.sync_weights(s.rollout_model, version)


def generate(worker, requests: Sequence[Any], timeout_s: float) -> list[Any]:
    if not requests:
        return []
    return worker.state.rollout.engine.generate(list(requests), timeout_s=timeout_s)


def behaviour_policy(worker, batch, lo: int, hi: int) -> dict[str, torch.Tensor]:
    s = worker.state
    return s.actor.behaviour_policy(batch.select(range(lo, hi)), s.cfg.trainer.micro_batch_size)


def update_shard(worker, batch, step: int) -> dict[str, Any]:
    """This rank's part of the update (`ppo_update.run_update` with its rank and world size)."""
    s = worker.state
    return run_update(s.engine, s.actor, batch, s.cfg, step, worker.rank, worker.world_size)


def export_trained(worker, folder: str) -> None:
    """Rank 0 writes the trained weights (LoRA or full, in the model library's format) from its
    rollout copy, which every update syncs from the sharded actor."""
    if worker.rank == 0:
        worker.state.rollout_model.save_trained(folder)


def save_shards(worker, folder: str) -> None:
    worker.state.engine.save_sharded(folder)


def load_shards(worker, folder: str) -> None:
    worker.state.engine.load_sharded(folder)  # the trainer then syncs the rollout copy


def close_worker(worker) -> None:
    worker.state.rollout.close()
    worker.close()


# --- the driver's side --------------------------------------------------------------------
def connect_ray(cfg: OmniConfig) -> bool:
    """`ray.init()`: a local Ray by default, `trainer.ray_address` to join a cluster. Returns
    whether this call started it (then the trainer shuts it down at the end)."""
    import ray

    if ray.is_initialized():
        return False
    t = cfg.trainer
    if t.ray_address:
        ray.init(address=t.ray_address, include_dashboard=False, log_to_driver=True)
    else:
        # One CPU per worker slot at least, and the reward workers' CPUs, even on a small machine
        # (the workers then share cores; an unsatisfiable request would wait forever).
        world = t.nnodes * t.devices_per_node if t.backend == "ray" else 0
        rewards = math.ceil(cfg.reward.num_workers * cfg.reward.worker_num_cpus)
        ray.init(num_cpus=max(os.cpu_count() or 1, world + rewards), include_dashboard=False, log_to_driver=True)
    return True


class RayRolloutEngine:
    """Stands in for a stage's rollout engine on the driver: shards requests over the workers.

    Rank r gets the r-th contiguous shard of the requests, sent as calls of at most
    `chunk_size` requests (one engine batch, `rollout.max_num_seqs`) that it runs one after
    another; each chunk's futures are completed the moment it is back, so the reward scorer
    works on finished samples while the workers sample the rest. Which rank or chunk samples a
    request does not change it (requests are seeded per sample)."""

    def __init__(self, workers: RayWorkers, timeout_s: float, chunk_size: int):
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size}: expected >= 1 requests per call")
        self.workers = workers
        self.timeout_s = timeout_s
        self.chunk_size = chunk_size
        self.weight_version = 0
        self._inflight: tuple[list[Future], list, list[tuple[int, int]], list[int]] | None = None

    def submit_many(self, requests: Sequence[Any]) -> list[Future]:
        """Send every chunk to its rank now; the futures complete in `wait`."""
        if self._inflight is not None:
            raise RuntimeError("RayRolloutEngine: a submission is still in flight; wait for it first")
        group = self.workers.group
        calls, spans = [], []
        for rank, (lo, hi) in enumerate(split_evenly(len(requests), group.world_size)):
            for a in range(lo, hi, self.chunk_size):
                b = min(a + self.chunk_size, hi)
                calls.append((rank, (list(requests[a:b]), self.timeout_s)))
                spans.append((a, b))
        futures: list[Future] = [Future() for _ in requests]
        refs = group.submit("rollout", generate, calls)
        self._inflight = (futures, refs, spans, [rank for rank, _ in calls])
        return futures

    def wait(self, requests: Sequence[Any], futures: Sequence[Future], timeout_s: float) -> list[Any]:
        """Complete `futures` chunk by chunk as the workers return them (their callbacks run
        here, on the driver's thread); a failed worker fails every future still pending.
        `timeout_s` is the engine interface's: here each worker's engine waits
        `rollout.timeout_s` and the group gives up after `trainer.worker_timeout_s`."""
        if self._inflight is None or self._inflight[0] is not futures:
            raise RuntimeError("RayRolloutEngine.wait: these futures are not the submission in flight")
        _, refs, spans, ranks = self._inflight
        self._inflight = None
        try:
            for i, results in self.workers.group.as_completed(refs, "rollout", ranks=ranks):
                a, b = spans[i]
                for fut, res in zip(futures[a:b], results):
                    fut.set_result(res)
        except BaseException as err:
            for fut in futures:
                if not fut.done():
                    fut.set_exception(err)
            raise
        return [f.result() for f in futures]

    def generate(self, requests: Sequence[Any], timeout_s: float | None = None) -> list[Any]:
        if not requests:
            return []
        return self.wait(requests, self.submit_many(requests), self.timeout_s)

    def sync_weights(self, source_model, version: int) -> None:
        """After an update: every worker's rollout copy takes the actor's new weights."""
        self.workers.group.run("weight sync", sync_rollout, [(version,)] * self.workers.group.world_size)
        self.weight_version = version

    def close(self) -> None:
        pass  # the worker group is closed by RayWorkers


class RayWorkers:
    """The trainer's handle on the worker group: the Ray counterparts of its stage methods."""

    def __init__(self, cfg: OmniConfig):
        from omni_rl.device import ray_device_resource

        t = cfg.trainer
        self.cfg = cfg
        self.started_ray = connect_ray(cfg)
        try:
            pool = ResourcePool(t.nnodes, t.devices_per_node, ray_device_resource(t.device))
            self.group = WorkerGroup(pool, t.device, t.worker_timeout_s, startup_timeout_s=t.worker_startup_timeout_s)
            self.group.run("build", build_hybrid, [(cfg,)] * self.group.world_size)
        except BaseException:
            self.close()
            raise
        self.rollout_engine = RayRolloutEngine(self, cfg.rollout.timeout_s, cfg.rollout.max_num_seqs)

    @property
    def step(self) -> int:
        return self.group.step

    @step.setter
    def step(self, value: int) -> None:
        self.group.step = value

    def behaviour_policy(self, batch) -> dict[str, torch.Tensor]:
        import ray

        ref = ray.put(batch)
        bounds = split_evenly(len(batch), self.group.world_size)
        parts = self.group.run("old log-probs", behaviour_policy, [(ref, lo, hi) for lo, hi in bounds])
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    def update(self, batch, step: int) -> dict[str, float]:
        import ray

        ref = ray.put(batch)
        parts = self.group.run("update", update_shard, [(ref, step)] * self.group.world_size, step=step)
        return summarize(parts)

    def export(self, folder: Path) -> None:
        """The trained weights into `folder` (written by rank 0; see `export_trained`)."""
        self.group.run("export", export_trained, [(str(folder),)] * self.group.world_size)

    def save(self, output_dir: Path, step: int, model, config_yaml: str, keep_last: int) -> Path:
        """A checkpoint folder as `checkpoint.save_checkpoint` writes it, with the optimizer and
        trainable tensors in `sharded/` (one DCP shard per rank) instead of trainer_state.pt.
        `model` (the driver's weightless view) only names the export's folder."""
        from omni_rl.trainer.checkpoint import (
            STATE_FILE,
            export_folder,
            prune_checkpoints,
            rng_state,
        )
        from omni_rl.utils.atomic import atomic_directory, atomic_torch_save

        target = Path(output_dir) / "checkpoints" / f"step_{step:06d}"
        with atomic_directory(target) as tmp:
            (tmp / SHARDED_DIR).mkdir()
            self.group.run("checkpoint save", save_shards, [(str(tmp / SHARDED_DIR),)] * self.group.world_size)
            self.export(tmp / export_folder(model))
            state = {"step": step, "rng": rng_state(), "sharded": SHARDED_DIR, "world_size": self.group.world_size}
            atomic_torch_save(state, tmp / STATE_FILE)
            (tmp / "config.yaml").write_text(config_yaml)
        prune_checkpoints(output_dir, keep_last)
        return target

    def load(self, state: dict[str, Any]) -> None:
        """Resume from a checkpoint `load_checkpoint` returned (any number of ranks: DCP reshards);
        the trainer then syncs the rollout copies."""
        from omni_rl.trainer.checkpoint import CheckpointError

        if "sharded" not in state:
            raise CheckpointError(
                f"trainer.resume: {state['folder']} was written by trainer.backend=local (no {SHARDED_DIR}/ folder); "
                f"resume it with trainer.backend=local"
            )
        folder = str(Path(state["folder"]) / state["sharded"])
        step = int(state["step"])
        self.group.run("checkpoint load", load_shards, [(folder,)] * self.group.world_size, step=step)

    def close(self) -> None:
        import ray

        group = getattr(self, "group", None)
        if group is not None and not group.closed:
            try:
                group.run("close", close_worker)
            except Exception as err:  # noqa: BLE001  (closing after a failure: kill regardless)
                log.warning("closing the worker group: %s", err)
            group.shutdown()
        if self.started_ray and ray.is_initialized():
            ray.shutdown()


def export_sharded_checkpoint(checkpoint: str, out_folder: str) -> Path:
    """Write the LoRA (PEFT / diffusers format) or full weights of a sharded checkpoint into
    `out_folder`, in one process without Ray: the model is built from the checkpoint's
    config.yaml and its trainable tensors are read from `sharded/`."""
    from omegaconf import OmegaConf

    from omni_rl.engine.fsdp2 import load_sharded_trainable
    from omni_rl.models.factory import build_model
    from omni_rl.trainer.checkpoint import find_checkpoint
    from omni_rl.utils.atomic import atomic_directory

    folder = find_checkpoint(checkpoint)
    if not (folder / SHARDED_DIR).is_dir():
        raise FileNotFoundError(
            f"{folder}: no {SHARDED_DIR}/ folder; this checkpoint was written by trainer.backend=local and "
            f"already holds its export in lora/ or model/"
        )
    cfg: OmniConfig = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(OmniConfig), OmegaConf.load(folder / "config.yaml"))
    )
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    load_sharded_trainable(model, str(folder / SHARDED_DIR))
    with atomic_directory(Path(out_folder)) as tmp:
        model.save_trained(str(tmp))
    return Path(out_folder)

"""The programs a Ray worker runs for the trainer, as `fn(worker, *args)` (see `WorkerGroup.run`).

`build_worker` installs a `WorkerState` on each rank: the sharded actor, the reference (LoRA off)
and an unsharded rollout copy synced after every update. The others are one call each: sample,
score, update, save, load, export.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.engine.base import TrainingEngine
from omni_rl.engine.registry import build_engine
from omni_rl.families import build_family
from omni_rl.families.base import BehaviourPolicy, ModelFamily
from omni_rl.families.update import run_update
from omni_rl.models.base import OmniModelBase
from omni_rl.models.factory import build_model
from omni_rl.rollout.backends import build_rollout_engine
from omni_rl.rollout.base import RolloutEngine
from omni_rl.workers.transfer import to_host


@dataclass
class WorkerState:
    """What one rank holds for the trainer."""

    cfg: OmniConfig
    model: OmniModelBase            # the actor (sharded by `engine`); LoRA off = the reference
    family: ModelFamily             # the actor half: replay and loss
    engine: TrainingEngine
    rollout_model: OmniModelBase    # the unsharded copy the rollout samples with
    rollout: RolloutEngine


def build_worker(worker, cfg: OmniConfig) -> None:
    t = cfg.trainer
    torch.manual_seed(t.seed)  # the same initial weights (and LoRA init) as one process
    model = build_model(cfg.model, worker.device, tuple(cfg.plugins))
    family = build_family(cfg, model)
    engine = build_engine(model, cfg)
    rollout_model = build_model(cfg.model, worker.device, tuple(cfg.plugins))
    worker.state = WorkerState(
        cfg=cfg, model=model, family=family, engine=engine, rollout_model=rollout_model,
        rollout=build_rollout_engine(cfg, rollout_model),
    )
    sync_rollout(worker, 0)


def sync_rollout(worker, version: int) -> None:
    """Sharded actor -> rollout copy: LoRA tensors only, or the full weights bucket by bucket."""
    s: WorkerState = worker.state
    for bucket in s.engine.trainable_buckets(s.cfg.trainer.weight_sync_bucket_mb << 20):
        s.rollout_model.load_named_tensors(bucket)
    s.rollout.sync_weights(s.rollout_model, version)


def generate(worker, requests: Sequence[Any], timeout_s: float) -> list[Any]:
    if not requests:
        return []
    # Through Ray to the driver: on the host, or a CUDA tensor would load onto the driver's GPU (transfer.py).
    return to_host(worker.state.rollout.generate(list(requests), timeout_s=timeout_s))


def behaviour_policy(worker, batch, lo: int, hi: int) -> BehaviourPolicy:
    s: WorkerState = worker.state
    return s.family.behaviour_policy(batch.select(range(lo, hi)), s.cfg.trainer.micro_batch_size)


def update_shard(worker, batch, step: int) -> dict[str, Any]:
    """This rank's part of the update (`run_update` with its rank and world size)."""
    s: WorkerState = worker.state
    return run_update(s.engine, s.family, batch, s.cfg, step, worker.rank, worker.world_size)


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
    if worker.state is not None:
        worker.state.rollout.close()
    worker.close()

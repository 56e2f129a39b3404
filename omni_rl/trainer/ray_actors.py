"""`RayActorGroup` (`trainer.backend=ray`): the actor group on Ray workers running FSDP2.

It starts one `HybridWorker` per slot of `nnodes x devices_per_node` (`RayOptions`), each holding
a sharded actor, its reference and a rollout copy (`workers.programs.build_worker`), and splits
each batch across ranks and gathers it back so the loop sees whole batches; each rank's loss is
scaled so that the update equals one process's. The driver holds no weights (a meta-device
model) and the old log-probs are always recomputed, since the rollout samples with a copy.

Left out: separate (non-colocated) actor and rollout pools.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from omni_rl.algos.forward_losses import FORWARD_LOSSES
from omni_rl.algos.policy_losses import DIFFUSION_LOSSES
from omni_rl.option import ComponentOptions, option
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.device import ray_device_resource, weightless_device
from omni_rl.families.base import BehaviourPolicy
from omni_rl.families.update import summarize
from omni_rl.models.factory import build_model
from omni_rl.trainer.actor_group import ActorGroup, register_backend
from omni_rl.trainer.checkpoint import SHARDED_DIR, CheckpointError, export_folder, write_checkpoint
from omni_rl.trainer.pipeline import PIPELINES
from omni_rl.trainer.weight_ema import EMA_OPTION_NAMES
from omni_rl.workers import ResourcePool, WorkerGroup, programs
from omni_rl.workers.ray_cluster import connect_ray
from omni_rl.workers.ray_rollout import RayRolloutEngine
from omni_rl.utils.shards import split_evenly

log = logging.getLogger(__name__)


@dataclass
class RayOptions(ComponentOptions):
    """The Ray worker group's options (`trainer.backend_options`)."""

    nnodes: int = option(1, "Machines of the resource pool: nnodes x devices_per_node workers (GPUs / NPUs, or CPUs on a CPU machine).")
    devices_per_node: int = option(1, "Workers (devices) per machine.")
    ray_address: Optional[str] = option(None, "null starts a local Ray; an address (auto, ray://host:10001, host:6379) joins a cluster.")
    worker_timeout_s: float = option(600.0, "A worker call (a rollout shard, an update) that takes longer than this fails the run with the worker named, instead of hanging; a dead worker fails it at once.")
    worker_startup_timeout_s: float = option(300.0, "Starting the workers (placement, process start, imports, the process group) has its own deadline: on a busy machine or a cold cluster it takes far longer than one call.")

    def check(self) -> None:
        for name in ("nnodes", "devices_per_node"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected an integer >= 1")
        for name in ("worker_timeout_s", "worker_startup_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name}={value!r}: expected > 0 seconds")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.devices_per_node


@register_backend("ray")
class RayActorGroup(ActorGroup):
    engines = ("fsdp2",)
    options_class = RayOptions

    @classmethod
    def check_options_block(cls, cfg: OmniConfig) -> None:
        t = cfg.trainer
        if PIPELINES.get(t.pipeline).samples_ahead:
            raise ConfigError(
                f"trainer.pipeline={t.pipeline!r}: expected on_policy with trainer.backend=ray (its rollout "
                f"copies live on the training workers, which run one call at a time, so a rollout cannot run "
                f"beside an update); use trainer.backend=local with rollout.backend=server for a pipelined run"
            )
        ema = [k for k in EMA_OPTION_NAMES if k in t.backend_options]
        if ema:
            raise ConfigError(
                f"trainer.backend_options.{ema[0]}={t.backend_options[ema[0]]!r}: the EMA of the trained weights is "
                f"kept with trainer.backend=local only (not for FSDP2's sharded parameters on Ray workers yet); use "
                f"trainer.backend=local, or drop the ema_* and val_weights options"
            )

    @classmethod
    def check_config(cls, cfg: OmniConfig) -> None:
        t = cfg.trainer
        if cfg.algo.policy_loss in FORWARD_LOSSES:
            raise ConfigError(
                f"algo.policy_loss={cfg.algo.policy_loss!r}: expected a step loss ({', '.join(DIFFUSION_LOSSES.names())}) "
                f"with trainer.backend=ray (the forward-process losses' EMA swap and preference pairs are not written "
                f"for sharded FSDP2 ranks yet); use trainer.backend=local"
            )
        world = t.backend_options.world_size
        # Each rank takes the same share of every mini-batch, in whole micro-batches, so that the
        # FSDP gradient average equals one process's mean over the mini-batch's micro-batches.
        if t.mini_batch_size % (world * t.micro_batch_size) != 0:
            raise ConfigError(
                f"trainer.mini_batch_size={t.mini_batch_size!r}: expected a multiple of trainer.backend_options.nnodes * "
                f"devices_per_node * trainer.micro_batch_size = {world} * {t.micro_batch_size} with "
                f"trainer.backend=ray (each worker takes whole micro-batches); lower trainer.micro_batch_size "
                f"or the worker count"
            )

    def __init__(self, cfg: OmniConfig):
        t = cfg.trainer
        self.cfg = cfg
        self.options = options = t.backend_options
        self.group = None
        self.started_ray = False  # until connect_ray says this process started it
        self.resumed_from = None  # the checkpoint `load` read: never pruned
        # The driver's view: tokenizer, processor, shapes; no weights (meta device).
        self.model = build_model(cfg.model, weightless_device(), tuple(cfg.plugins))
        self.started_ray = connect_ray(cfg, options.ray_address, options.world_size)
        try:
            pool = ResourcePool(options.nnodes, options.devices_per_node, ray_device_resource(t.device))
            self.group = WorkerGroup(pool, t.device, options.worker_timeout_s,
                                     startup_timeout_s=options.worker_startup_timeout_s)
            self.group.run("build", programs.build_worker, [(cfg,)] * self.group.world_size)
        except BaseException:
            self.close()
            raise
        self.rollout_engine = RayRolloutEngine(self.group, cfg.rollout.timeout_s, cfg.rollout.max_num_seqs)

    @property
    def rollout_is_behaviour_policy(self) -> bool:
        return False  # the rollout samples with its own copy (and, on GPUs, other kernels)

    def set_step(self, step: int) -> None:
        self.group.step = step  # named in a failed worker's error

    def behaviour_policy(self, batch) -> BehaviourPolicy:
        import ray

        ref = ray.put(batch)
        bounds = split_evenly(len(batch), self.group.world_size)
        parts = self.group.run("old log-probs", programs.behaviour_policy, [(ref, lo, hi) for lo, hi in bounds])
        means = None if parts[0].means is None else torch.cat([p.means for p in parts])
        routes = None if parts[0].routes is None else torch.cat([p.routes for p in parts])
        if routes is not None:
            # routing_replay=r2: the routes each rank's old-policy forward used travel with the
            # batch to the update, which may give its rows to other ranks.
            batch.old_routes = routes
        return BehaviourPolicy(torch.cat([p.log_probs for p in parts]), torch.cat([p.mask for p in parts]), means, routes)

    def update(self, batch, step: int) -> dict[str, float]:
        import ray

        ref = ray.put(batch)
        parts = self.group.run("update", programs.update_shard, [(ref, step)] * self.group.world_size, step=step)
        return summarize(parts)

    def sync_rollout(self, version: int) -> None:
        self.rollout_engine.sync_weights(self.model, version)

    def export(self, folder: Path) -> None:
        """The trained weights into `folder` (written by rank 0; see `programs.export_trained`)."""
        self.group.run("export", programs.export_trained, [(str(folder),)] * self.group.world_size)

    def save(self, output_dir: Path, step: int, config_yaml: str, pipeline=None) -> Path:
        """A checkpoint folder as `checkpoint.write_checkpoint` makes it, with the optimizer and
        trainable tensors in `sharded/` (one DCP shard per rank) and the step, RNG states and
        world size in trainer_state.json."""

        def write_weights(folder: Path) -> dict[str, Any]:
            (folder / SHARDED_DIR).mkdir()
            self.group.run("checkpoint save", programs.save_shards, [(str(folder / SHARDED_DIR),)] * self.group.world_size)
            self.export(folder / export_folder(self.model))
            return {"sharded": SHARDED_DIR, "world_size": self.group.world_size}

        return write_checkpoint(
            output_dir, step, self.model, config_yaml, self.cfg.trainer.keep_last_checkpoints, write_weights, pipeline,
            protect=self.resumed_from,
        )

    def load(self, state: dict[str, Any]) -> None:
        """Resume from a checkpoint `load_checkpoint` returned (any number of ranks: DCP reshards);
        the trainer then syncs the rollout copies."""
        if "sharded" not in state:
            raise CheckpointError(
                f"trainer.resume: {state['folder']} was written by trainer.backend=local (no {SHARDED_DIR}/ folder); "
                f"resume it with trainer.backend=local"
            )
        self.resumed_from = Path(state["folder"])
        folder = str(Path(state["folder"]) / SHARDED_DIR)
        step = int(state["step"])
        self.group.run("checkpoint load", programs.load_shards, [(folder,)] * self.group.world_size, step=step)

    def close(self) -> None:
        import ray

        group = self.group
        if group is not None and not group.closed:
            try:
                group.run("close", programs.close_worker)
            except Exception as err:  # noqa: BLE001  (closing after a failure: kill regardless)
                log.warning("closing the worker group: %s", err)
            group.shutdown()
        if self.started_ray and ray.is_initialized():
            ray.shutdown()

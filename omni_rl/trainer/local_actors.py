"""`LocalActorGroup` (`trainer.backend=local`): the actor, its reference and the rollout in this process.

One model serves all three: the training engine updates it in place, the reference policy is
the same model with LoRA disabled, and the rollout engine samples with it, so a weight sync
only records the version and the rollout's log-probs are the actor's own (when the engine says
its code path is the trainer's: `RolloutEngine.same_log_probs_as`). An engine with a model of its
own (`rollout.backend=server`: another process) takes the trainable tensors at each sync instead.

Pipelined (`trainer.pipeline` one_step_off / async), the rollout samples while the update changes
the weights, so it cannot sample with the trained model: an engine that would
(`rollout.backend=native`) is built on a copy of the model of its own, built like the first and
given the actor's trainable tensors (version 0), then whatever version the producer loads. The
cost is one more model in memory; a GPU run would rather use `rollout.backend=server`,
`vllm_omni` or `vllm` on devices of its own.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.device import pick_device
from omni_rl.engine.registry import build_engine
from omni_rl.families import build_family
from omni_rl.families.base import BehaviourPolicy
from omni_rl.families.update import run_update, summarize
from omni_rl.models.factory import build_model
from omni_rl.rollout.backends import build_rollout_engine, shares_model
from omni_rl.rollout.base import weight_kind
from omni_rl.trainer.actor_group import ActorGroup, register_backend
from omni_rl.trainer.checkpoint import CheckpointError, save_checkpoint
from omni_rl.trainer.pipeline import PIPELINES, WeightSnapshot


@register_backend("local")
class LocalActorGroup(ActorGroup):
    engines = ("local",)

    def __init__(self, cfg: OmniConfig):
        self.cfg = cfg
        self.resumed_from = None  # the checkpoint `load` read: never pruned
        self.model = build_model(cfg.model, pick_device(cfg.trainer.device), tuple(cfg.plugins))
        self.family = build_family(cfg, self.model)
        self.engine = build_engine(self.model, cfg)
        rollout_model = self._rollout_model()
        self.rollout_engine = build_rollout_engine(cfg, rollout_model)
        if rollout_model is not self.model:  # the copy starts from the actor's weights
            self.rollout_engine.update_weights(self.model.named_trainable_tensors(), 0, weight_kind(self.model))
        self.version = 0

    def _rollout_model(self):
        """The model the rollout engine is built on: the trained one, or, pipelined with an engine
        that samples with the model it is given, a copy (the RNG untouched: the run stays the same)."""
        if not PIPELINES.get(self.cfg.trainer.pipeline).samples_ahead or not shares_model(self.cfg):
            return self.model
        with torch.random.fork_rng(devices=[]):
            return build_model(self.cfg.model, self.model.device, tuple(self.cfg.plugins))

    @property
    def rollout_is_behaviour_policy(self) -> bool:
        return self.rollout_engine.same_log_probs_as(self.model) and self.rollout_engine.weight_version == self.version

    def behaviour_policy(self, batch) -> BehaviourPolicy:
        return self.family.behaviour_policy(batch, self.cfg.trainer.micro_batch_size)

    def update(self, batch, step: int) -> dict[str, float]:
        return summarize([run_update(self.engine, self.family, batch, self.cfg, step)])

    def sync_rollout(self, version: int) -> None:
        self.version = version
        self.rollout_engine.sync_weights(self.model, version)

    def weights_snapshot(self, version: int) -> WeightSnapshot:
        tensors = {n: t.detach().clone() for n, t in self.model.named_trainable_tensors().items()}
        return WeightSnapshot(version, weight_kind(self.model), tensors)

    def save(self, output_dir: Path, step: int, config_yaml: str, pipeline=None) -> Path:
        return save_checkpoint(
            output_dir, step, self.engine.state_dict(), self.model, config_yaml, self.cfg.trainer.keep_last_checkpoints,
            pipeline, family_tensors=self.family.state_tensors(), protect=self.resumed_from,
        )

    def load(self, state: dict[str, Any]) -> None:
        """Resume from a checkpoint `load_checkpoint` returned (and `check_compatible` passed)."""
        if "sharded" in state:
            raise CheckpointError(
                f"trainer.resume={self.cfg.trainer.resume!r}: {state['folder']} holds a sharded checkpoint "
                f"(trainer.backend=ray); resume it with trainer.backend=ray trainer.engine=fsdp2, or export its "
                f"weights with omni_rl.trainer.sharded_export.export_sharded_checkpoint"
            )
        self.resumed_from = Path(state["folder"])
        try:
            self.engine.load_state_dict(state)
        except (KeyError, ValueError, RuntimeError) as err:  # the optimizer's layout differs
            raise CheckpointError(
                f"trainer.resume={self.cfg.trainer.resume!r}: the state in {state['folder']} does not load into "
                f"this run's training engine ({err}); resume with the config the checkpoint was written with"
            ) from err
        try:
            self.family.load_state_tensors(state.get("family", {}))
        except ValueError as err:
            raise CheckpointError(f"trainer.resume={self.cfg.trainer.resume!r}: {state['folder']}: {err}") from err

    def export(self, folder: Path) -> None:
        self.model.save_trained(str(folder))

    def close(self) -> None:
        self.rollout_engine.close()

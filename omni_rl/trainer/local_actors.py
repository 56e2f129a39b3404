"""`LocalActorGroup` (`trainer.backend=local`): the actor, its reference and the rollout in this process.

One model serves all three: the engine updates it in place, the reference is the same model
with LoRA off, and the rollout samples with it, so a sync only records the version (an engine
with a model of its own, such as `server`, takes the trainable tensors instead). Pipelined, the
rollout cannot sample with the model being trained, so a `native` engine gets a copy of its own
(one more model in memory). With `ema_decay` the group keeps a `WeightEMA` for checkpoints, the
export and validation.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator

import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.device import pick_device
from omni_rl.engine.registry import build_engine
from omni_rl.families import build_family
from omni_rl.families.base import BehaviourPolicy
from omni_rl.families.update import run_update, summarize
from omni_rl.models.compile import compile_options_of, compiled_graphs
from omni_rl.models.factory import build_model
from omni_rl.rollout.backends import build_rollout_engine, shares_model
from omni_rl.rollout.base import weight_kind
from omni_rl.trainer.actor_group import ActorGroup, register_backend
from omni_rl.trainer.checkpoint import CheckpointError, save_checkpoint
from omni_rl.trainer.pipeline import PIPELINES, WeightSnapshot
from omni_rl.trainer.weight_ema import EXPORT_SUBFOLDER, EMAOptions, WeightEMA

log = logging.getLogger(__name__)


@register_backend("local")
class LocalActorGroup(ActorGroup):
    engines = ("local",)
    options_class = EMAOptions

    def __init__(self, cfg: OmniConfig):
        self.cfg = cfg
        self.options = cfg.trainer.backend_options
        self.resumed_from = None  # the checkpoint `load` read: never pruned
        self.model = build_model(cfg.model, pick_device(cfg.trainer.device), tuple(cfg.plugins))
        self.family = build_family(cfg, self.model)
        self.engine = build_engine(self.model, cfg)
        self.ema = WeightEMA(self.model, self.options) if self.options.keeps_ema else None
        rollout_model = self._rollout_model()
        self.rollout_engine = build_rollout_engine(cfg, rollout_model)
        # Whether the engine samples with the trained parameters themselves (then an EMA swap reaches it).
        self.rollout_shares_parameters = rollout_model is self.model and shares_model(cfg)
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
        after = self.ema.after_optimizer_step if self.ema is not None else None
        metrics = summarize([run_update(self.engine, self.family, batch, self.cfg, step, after_optimizer_step=after)])
        if compile_options_of(self.cfg.model).enabled:  # a recompile shows as a rise after the first step
            metrics["perf/compiled_graphs"] = float(compiled_graphs())
        return metrics

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
            ema_tensors=self.ema.tensors if self.ema is not None else None,
            ema_meta=self.ema.meta() if self.ema is not None else None,
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
            self._load_ema(state)
        except ValueError as err:
            raise CheckpointError(f"trainer.resume={self.cfg.trainer.resume!r}: {state['folder']}: {err}") from err

    def _load_ema(self, state: dict[str, Any]) -> None:
        saved = state.get("ema_tensors")
        if self.ema is None:
            if saved is not None:
                log.info("%s holds an EMA of the weights; this run keeps none (trainer.backend_options.ema_decay "
                         "unset), so it is not carried on", state["folder"])
            return
        if saved is None:
            log.warning("%s holds no EMA of the weights (its run kept none): the EMA starts from the resumed "
                        "weights", state["folder"])
            self.ema = WeightEMA(self.model, self.options)
            return
        self.ema.load(saved, state["ema"])

    def export(self, folder: Path) -> None:
        """The trained weights into `folder`; with an EMA, the EMA's, in the same format, into `folder/ema`."""
        self.model.save_trained(str(folder))
        if self.ema is not None:
            with self.ema.swapped_in():
                self.model.save_trained(str(Path(folder) / EXPORT_SUBFOLDER))

    def validation_weights(self) -> tuple[str, ...]:
        return self.options.validation_weights()

    @contextlib.contextmanager
    def sampling_with(self, which: str, engine) -> Iterator[None]:
        if which == "trained":
            yield
            return
        if which != "ema" or self.ema is None:
            raise ValueError(f"sampling_with({which!r}): this run keeps {self.validation_weights()}")
        if engine is self.rollout_engine and self.rollout_shares_parameters:
            with self.ema.swapped_in():
                yield
            return
        # An engine with a model of its own holds the trained weights now (validation runs
        # after the step's publish): it gets the EMA under its version, then those weights back.
        version, kind = engine.weight_version, weight_kind(self.model)
        engine.update_weights(self.ema.tensors, version, kind)
        try:
            yield
        finally:
            engine.update_weights(self.model.named_trainable_tensors(), version, kind)

    def close(self) -> None:
        self.rollout_engine.close()

"""The PPO trainer: one loop, read top to bottom.

    rollout producer -> the step's batch -> rewards -> advantages
             -> old log-probs (the rollout's where they are the actor's own, else recomputed)
                and the rollout-correction weights -> PPO update (epochs x mini-batches)
             -> weight sync (through the producer) -> log / validate / checkpoint

It wires the parts together and owns the run's outputs, talking to an `ActorGroup`, the model's
`ModelFamily` and a `RolloutProducer` without asking which kind any is. Everything random is
seeded from (trainer.seed, step, sample), so a resumed run repeats the uninterrupted one.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator, NamedTuple, Optional

import torch

from omni_rl.algos.advantages import AdvantageInput, get_advantage_estimator
from omni_rl.algos.latent_streams import LatentStreams
from omni_rl.algos.modality_routing import routed_advantages, stream_rewards, stream_routes
from omni_rl.algos.rollout_correction import rollout_is_weights
from omni_rl.config.loader import to_yaml
from omni_rl.config.schema import OmniConfig
from omni_rl.data.prompts import PromptSampler, validation_prompt_items
from omni_rl.families import build_family
from omni_rl.families.base import BehaviourPolicy, prompt_limits
from omni_rl.families.teachers import pooled_teachers, teachers_of
from omni_rl.workers.teacher_pool import TeacherPools
from omni_rl.families.update import FIRST_GAP_MAX_KEY, FIRST_GAP_MEAN_KEY
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.models.limits import check_built_model, check_loaded_limits
from omni_rl.logging.heldout_alarm import HeldoutAlarm, RewardHackingAlarm
from omni_rl.logging import MetricLogger, ProgressBar, attach_run_log, build_sinks, plot_reward_curve
from omni_rl.logging.renamed import Renamed, rename
from omni_rl.reward.async_scorer import AsyncRewardScorer
from omni_rl.reward.manager import RewardManager, RewardSpec
from omni_rl.reward.registry import reward_modalities
from omni_rl.trainer.actor_group import ACTOR_GROUPS
from omni_rl.trainer.checkpoint import check_compatible, export_folder, list_checkpoints, load_checkpoint, set_rng_state
from omni_rl.trainer.interrupt import StopOnSignal, TrainingInterrupted
from omni_rl.trainer.leftovers import remove_stale_tiny_builds
from omni_rl.trainer.no_signal import NoSignalWatch
from omni_rl.trainer.pipeline import PIPELINES, PipelineState, Produced
from omni_rl.trainer.run_dir import DISK_FULL, OutputWriteError, open_run_dir, write_failure
from omni_rl.trainer.timer import StepTimer
from omni_rl.trainer.weight_ema import VAL_FOLDER, VAL_NAMESPACE
from omni_rl.utils.atomic import atomic_directory, atomic_write_text
from omni_rl.trainer.reward_overlap import rewards_overlap_rollout
from omni_rl.workers.reward_worker import RayRewardManager

log = logging.getLogger(__name__)


class OldPolicy(NamedTuple):
    """What the update needs from the behaviour policy, and how far the rollout is from it."""

    log_probs: torch.Tensor                      # the ratio's old log-probs [N, E]
    means: Optional[torch.Tensor]                # old transition means, for losses that read them
    rollout_is_weights: Optional[torch.Tensor]   # [N, E], None when algo.rollout_correction_options.level is off or a no-op
    metrics: dict[str, float]                    # rollout_corr/*


class Scored(NamedTuple):
    """The metrics of a batch's scoring (`PPOTrainer.score`), before the update."""

    reward: dict[str, float]        # reward/*, and the family's rollout metrics
    rollout_corr: dict[str, float]  # the old-policy pass's rollout_corr/*
    actor: dict[str, float]         # actor/advantage_abs_mean


# A batch whose preferences are given (offline pairs) is not scored: no reward, advantage or old log-prob.
NOT_SCORED = Scored({}, {}, {})


class PPOTrainer:
    def __init__(self, cfg: OmniConfig):
        self.cfg = cfg
        t = cfg.trainer
        self.output_dir = Path(t.output_dir)
        # Checked, held (until _close) and tidied before any model loads: a bad or busy folder
        # fails in a second, not after minutes of loading weights.
        self.run_dir = open_run_dir(cfg)
        self.actors = self.rewards = self.val_rewards = self.reward_scorer = self.run_log = self.producer = None
        self.teacher_pools = None
        self.owns_ray = False
        try:
            self.run_log = attach_run_log(self.output_dir)  # OUTPUT/train.log: every record, noise included
            try:
                remove_stale_tiny_builds(cfg.model.path)
            except OSError as err:  # the shared cache is not this run's to fail on
                log.warning("could not clean up the tiny-model cache: %s", err)
            torch.manual_seed(t.seed)
            self._start_teacher_pools()
            self.actors = ACTOR_GROUPS.get(t.backend)(cfg)
            self.model = self.actors.model  # the driver's view: what building requests needs
            if isinstance(self.model, DiffusionModelBase):  # a geometry it cannot take: one line, before sampling
                check_built_model(self.model, cfg)
            check_loaded_limits(self.model, cfg)  # what the configs were not on disk to show before the load
            # The rollout half only: the actor half (the loss, an EMA) lives where the weights are trained.
            self.family = build_family(cfg, self.model, trains=False)
            self.rollout_engine = self.actors.rollout_engine
            self._build_rewards()
            self.advantage_fn = get_advantage_estimator(cfg.algo.advantage)
            self.advantage_options = cfg.algo.advantage_options
            # Teachers give a signal of their own (on-policy distillation): uniform rewards stop nothing.
            self.no_signal = None if teachers_of(cfg.algo.family_options) else NoSignalWatch(
                self.advantage_options.max_uniform_steps)
            self.rollout_correction = cfg.algo.rollout_correction_options
            self.logger_options = cfg.trainer.logger_options
            self.alarm = HeldoutAlarm(self.logger_options)
            self.start_step = 0
            saved = self._resume(t.resume) if t.resume else None
            # Where each step's batch comes from (its first unit is made by the first step).
            self.producer = PIPELINES.get(t.pipeline)(cfg, self.actors, self._rollout_unit, self.start_step, saved)
            # Every prompt measured once against the model's context (algo.family_options.overlong_prompts). The
            # producer names them: the data's prompts, or the pairs' (read once, by the producer).
            items = self.family.fit_prompts(self.producer.prompt_items(), "data.prompts")
            limits = prompt_limits(cfg)
            self.sampler = PromptSampler(items, t.prompts_per_step, t.seed, cfg.data.shuffle)
            val_given = validation_prompt_items(cfg.data, limits)
            val_items = self.family.fit_prompts(val_given, "data.val_prompts") if val_given is not None else items
            if val_given is None and t.val_every:
                log.warning(
                    "validation reuses the training prompts (data.val_prompts and data.val_prompt_file are unset), so "
                    "val/* is no held-out number; set data.val_prompt_file to a file of held-out prompts"
                )
            self.val_items = val_items[: t.val_num_prompts]
            uncorrected = self.rollout_correction.level == "none" and cfg.algo.old_logprob_mode != "bypass"
            if self.producer.samples_ahead and uncorrected:
                log.warning(
                    "trainer.pipeline=%s with algo.rollout_correction_options.level=none: stale samples are not reweighted "
                    "towards the current policy; set algo.rollout_correction_options.level (step or sequence for diffusion, "
                    "token or sequence for text)",
                    t.pipeline,
                )
            with self._writing("config.yaml"):
                atomic_write_text(self.output_dir / "config.yaml", to_yaml(cfg))
            self.logger = MetricLogger(
                build_sinks(
                    t.loggers, self.output_dir, project=self.logger_options.wandb_project, config=None,
                    console_every=t.log_every, resume_from_step=self.start_step if t.resume else None,
                )
            )
        except BaseException:
            self._close()
            raise

    def _start_teacher_pools(self) -> None:
        """Teachers with placement=pool in Ray actors of their own, started before the training
        processes, which find them by name when they build their families."""
        if not pooled_teachers(self.cfg):
            return
        from omni_rl.workers.ray_cluster import connect_ray

        t = self.cfg.trainer
        ray_backend = t.backend == "ray"
        self.owns_ray = connect_ray(self.cfg, t.backend_options.ray_address if ray_backend else None,
                                    t.backend_options.world_size if ray_backend else 0) or self.owns_ray
        self.teacher_pools = TeacherPools(self.cfg)

    def _build_rewards(self) -> None:
        rc = self.cfg.reward
        specs = reward_specs(rc.rewards)
        # With teachers, a run may be pure distillation: its rewards, all of weight 0, only report.
        metrics_only = bool(teachers_of(self.cfg.algo.family_options))
        workers = self.cfg.reward.worker_options
        if workers.num_workers > 0:
            # Reward models in their own Ray actors (and devices), scored several batches at once.
            from omni_rl.workers.ray_cluster import connect_ray

            self.owns_ray = connect_ray(self.cfg) or self.owns_ray  # (a teacher pool may have started it)
            self.rewards = RayRewardManager(
                specs, self.cfg.plugins, workers.num_workers, rc.timeout_s, workers.num_cpus, workers.num_gpus,
                metrics_only,
            )
        else:
            self.rewards = RewardManager(specs, plugins=self.cfg.plugins, metrics_only=metrics_only)
        self.val_rewards = self.rewards
        if rc.val_rewards is not None:
            self.val_rewards = RewardManager(reward_specs(rc.val_rewards), plugins=self.cfg.plugins)
        if rewards_overlap_rollout(self.cfg):
            self.reward_scorer = AsyncRewardScorer(
                self.rewards, rc.max_batch_size, rc.max_wait_ms, num_threads=max(1, workers.num_workers)
            )

    # --- the loop ------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        """Train from `start_step` to `trainer.total_steps`, then export the weights.

        A SIGTERM or SIGINT stops after the current step, saved (`TrainingInterrupted`); a failed write
        raises `OutputWriteError`.
        """
        t = self.cfg.trainer
        bar = ProgressBar(total=t.total_steps, initial=self.start_step, disable=not self.logger_options.progress_bar)
        metrics: dict[str, float] = {}
        try:
            with StopOnSignal() as stop, self._writing(f"the outputs in {self.output_dir}", disk_full_only=True):
                if t.val_every and self.start_step == 0:
                    first = self.validate(0)
                    self._check_alarm(0, first)
                    self.logger.log(first, 0)
                self._stop_if_asked(stop, self.start_step, None)
                for step in range(self.start_step + 1, t.total_steps + 1):
                    metrics = self.train_step(step)
                    self.alarm.observe_train(metrics)
                    alarmed = None
                    if t.val_every and (step % t.val_every == 0 or step == t.total_steps):
                        metrics.update(self.validate(step))
                        alarmed = self._check_alarm(step, metrics)
                    if step % t.log_every == 0 or step == t.total_steps:
                        self.logger.log(metrics, step)
                    bar.update(step, metrics)
                    saved = None
                    if (t.save_every and step % t.save_every == 0) or step == t.total_steps or stop.requested \
                            or alarmed:
                        saved = self._save(step)
                    self._stop_if_asked(stop, step, saved)
                    if alarmed:
                        raise RewardHackingAlarm(f"{alarmed}; stopped at step {step} as trainer.logger_options."
                                                 f"alarm_stop asks (its checkpoint: {saved})")
            with self._writing(f"the exported weights in {self.output_dir / export_folder(self.model)}"):
                self.export(self.output_dir / export_folder(self.model))
            self._plot_rewards()  # before _close lets another run take the folder
        finally:
            bar.close()
            try:
                self.logger.close()
            except OSError as err:  # a full disk already failed the run; do not hide that error
                log.warning("closing the metric logs: %s", err)
            self._close()
        return metrics

    def _check_alarm(self, step: int, metrics: dict[str, float]) -> Optional[str]:
        """Add this validation's alarm/* metrics; the warning, when it fired and the run must stop."""
        t = self.cfg.trainer
        alarm_metrics, warning = self.alarm.update(step, metrics, len(self.val_items) * t.val_samples_per_prompt)
        metrics.update(alarm_metrics)
        if warning is None:
            return None
        log.warning("held-out alarm: %s", warning)
        return warning if self.alarm.options.alarm_stop else None

    def _stop_if_asked(self, stop: StopOnSignal, step: int, saved: Optional[Path]) -> None:
        if stop.requested:
            resumed_from = self.cfg.trainer.resume if step == self.start_step else None
            raise TrainingInterrupted(stop.signum, step, saved, resume_hint=resumed_from)

    def _save(self, step: int) -> Path:
        with self._writing(f"the checkpoint of step {step} in {self.output_dir / 'checkpoints'}"):
            return self.save(step)

    @contextlib.contextmanager
    def _writing(self, what: str, disk_full_only: bool = False) -> Iterator[None]:
        """A failed write inside (a full disk, a folder gone read-only: see `run_dir.write_failure`)
        becomes one OutputWriteError naming `what` and the last good checkpoint, which a failed
        atomic save leaves intact. With `disk_full_only`, only a full disk: around the whole
        loop, where other OSErrors (a reward server's ConnectionError, a TimeoutError) are not
        about writing."""
        try:
            yield
        except (OutputWriteError, TrainingInterrupted):
            raise
        except Exception as err:
            reason = write_failure(err)
            if reason is None or (disk_full_only and reason != DISK_FULL):
                raise
            found = list_checkpoints(self.output_dir)
            last = f"the last good checkpoint is {found[-1]}" if found else "no earlier checkpoint is in this run's folder"
            raise OutputWriteError(f"{reason} while writing {what}; {last}") from err

    def train_step(self, step: int) -> dict[str, float]:
        timer = StepTimer()
        self.actors.set_step(step)
        with timer(self.producer.phase):
            # Sampled now (on_policy) or ahead of time, each sample saying its weight version; or
            # pairs whose preferences are given (offline_pairs).
            produced = self.producer.next(step)
            batch = produced.batch
        scored = NOT_SCORED if produced.preferences_given else self.score(batch, produced, step, timer)
        with timer("update"):
            update = self.actors.update(batch, step)
        with timer("weight_sync"):
            self.producer.publish(step)
        return {
            **scored.reward, **update, **rollout_corr_metrics(scored.rollout_corr, update),
            **produced.metrics, **timer.metrics(len(batch)), **scored.actor,
        }

    def score(self, batch, produced: Produced, step: int, timer: StepTimer) -> Scored:
        """A sampled batch made ready for the update: its rewards, advantages and old log-probs
        (and rollout-correction weights) set on it. Returns the step's metrics of each."""
        scorer = self.reward_scorer
        with timer("reward"):
            # With overlap the samples were being scored during the rollout; this waits for the rest.
            if scorer is not None:
                reward = scorer.gather(produced.reward_futures, self.cfg.reward.timeout_s)
            else:
                reward = self.rewards.score(*self.family.reward_inputs(batch))
            batch.rewards = reward.total
            # Before the update: a run of steps with no signal stops here, not after training on it.
            if self.no_signal is not None:
                self.no_signal.observe(step, reward.total, batch.group_index, reward.per_reward)
            batch.advantages = self.advantage_fn(
                AdvantageInput(reward.total, batch.group_index, self.advantage_options.std_mode, self.advantage_options.eps)
            )
            routed = self._stream_advantages(batch, reward.per_reward) if self.advantage_options.modality_routing else {}
        actor = {"actor/advantage_abs_mean": float(batch.advantages.abs().mean()), **routed}
        with timer("old_log_prob"):
            old = self.old_policy(batch, step, fresh=produced.metrics["rollout_corr/staleness_max"] == 0)
            batch.old_log_probs, batch.old_means, batch.rollout_is_weights = old.log_probs, old.means, old.rollout_is_weights
        return Scored({**reward.metrics, **self.family.rollout_metrics(batch)}, old.metrics, actor)

    def _stream_advantages(self, batch, per_reward: dict[str, torch.Tensor]) -> dict[str, float]:
        """algo.advantage_options.modality_routing: each latent stream's advantage set on the batch
        (`stream_advantages`); returns `actor/advantage_abs_mean/<stream>`."""
        batch.stream_advantages = stream_advantages(
            self.cfg.reward.rewards, self.advantage_fn, self.advantage_options, batch.final_latents.names,
            batch.group_index, per_reward,
        )
        return {f"actor/advantage_abs_mean/{s}": float(a.abs().mean()) for s, a in batch.stream_advantages.streams.items()}

    # --- parts ---------------------------------------------------------------------------
    def _rollout_unit(self, index: int):
        """The batch (and reward futures) of step `index`'s prompts and seeds, with the weights the
        engine holds: what the producer samples, now or ahead of time."""
        scorer = self.reward_scorer
        prompts = self.sampler.prompts_for_step(index - 1)
        return self.family.rollout(self.rollout_engine, prompts, index, scorer.submit if scorer else None)

    def old_policy(self, batch, step: int, fresh: bool = True) -> OldPolicy:
        """The ratio's old log-probs, the old transition means (None unless the loss reads them),
        the rollout-correction weights and how far the rollout's log-probs are from the trainer's.

        The rollout's log-probs serve as the old ones where they are the actor's own (`auto`, every
        sample fresh, the actor group says so) or with `bypass`; otherwise the actor recomputes them,
        and also when the loss reads old means and every `algo.logprob_check_every` steps, measuring the
        gap on every sample (docs/algorithms.md, Log-probs and the old policy). With stale samples the
        rollout-correction weights correct the staleness (decoupled PPO); where the rollout's log-probs
        are the old ones every weight is exactly 1 and none is computed.
        """
        algo = self.cfg.algo
        use_rollout = algo.old_logprob_mode == "bypass" or (
            algo.old_logprob_mode == "auto" and fresh and self.actors.rollout_is_behaviour_policy
        )
        correction = self.rollout_correction
        unit = {} if correction.level == "none" else {
            "rollout_corr/is_weight_mean": 1.0, "rollout_corr/is_weight_max": 1.0, "rollout_corr/is_clipped_fraction": 0.0,
        }
        check = algo.logprob_check_every > 0 and (step - 1) % algo.logprob_check_every == 0
        if use_rollout and not check and not self.family.reads_old_means:
            first = min(self.cfg.trainer.mini_batch_size, len(batch)) / len(batch)
            return OldPolicy(batch.rollout_log_probs, None, None, {"rollout_corr/checked_fraction": first, **unit})
        scored = self.actors.behaviour_policy(batch)
        # The trainer's scores come back on the host; the rollout's may live on the device
        # (rollout.backend_options.trajectory_device): compared on the host.
        rollout_log_probs = batch.rollout_log_probs.to(scored.log_probs.device)
        metrics = rollout_gap(rollout_log_probs, scored)
        if use_rollout:
            return OldPolicy(batch.rollout_log_probs, scored.means, None, {**metrics, **unit})
        weights = None
        if correction.level != "none":
            weights, is_metrics = rollout_is_weights(
                scored.log_probs, rollout_log_probs, scored.mask, correction.level, correction.cap, correction.mode,
            )
            metrics.update({f"rollout_corr/{k}": float(v) for k, v in is_metrics.items()})
        return OldPolicy(scored.log_probs, scored.means, weights, metrics)

    def validate(self, step: int) -> dict[str, float]:
        """`val/*` with the trained weights and/or `val_ema/*` with their EMA (`ActorGroup.validation_weights`)."""
        metrics: dict[str, float] = {}
        for which in self.actors.validation_weights():
            metrics.update(self.producer.exclusive(lambda engine, which=which: self._validate_with(engine, which, step)))
        return metrics

    def _validate_with(self, engine, which: str, step: int) -> dict[str, float]:
        # The same validation for either weights: the EMA's is written under its own namespace and folder.
        space, folder = VAL_NAMESPACE[which], self.output_dir / VAL_FOLDER[which]
        logger = self.logger if space == "val" else Renamed(self.logger, "val", space)
        with self.actors.sampling_with(which, engine):
            metrics = self.family.validate(engine, self.val_items, step, self.val_rewards, folder, logger)
        return rename(metrics, "val", space)

    # --- outputs -------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        return self.actors.save(self.output_dir, step, to_yaml(self.cfg), self.producer.state())

    def _resume(self, path: str) -> Optional[PipelineState]:
        """Load the checkpoint `path` names; returns the rollouts it had in flight (None: none)."""
        state = load_checkpoint(path)  # verified against its manifest; nothing unpickled
        check_compatible(state, self.cfg, self.model)
        self.actors.load(state)
        set_rng_state(state["rng"])
        self.start_step = int(state["step"])
        self.actors.sync_rollout(self.start_step)
        log.info("resumed from %s at step %d", state["folder"], self.start_step)
        total = self.cfg.trainer.total_steps
        if total <= self.start_step:
            log.warning(
                "trainer.total_steps=%d is not above the checkpoint's step %d: nothing to train; raise "
                "trainer.total_steps to continue", total, self.start_step,
            )
        if "pipeline" not in state:
            return None
        if not PIPELINES.get(self.cfg.trainer.pipeline).samples_ahead:
            log.info("%s holds rollouts sampled ahead (a pipelined run); %s samples afresh", state["folder"],
                     self.cfg.trainer.pipeline)
            return None
        return PipelineState(state["pipeline"], state["pipeline_tensors"])

    def export(self, folder: Path) -> None:
        """The trained weights (LoRA or full) into `folder`, atomically (with an EMA of them, its
        weights in `folder/ema/`, `LocalActorGroup.export`)."""
        with atomic_directory(folder) as tmp:
            self.actors.export(tmp)

    def _close(self) -> None:
        try:
            if self.producer is not None:
                self.producer.close()
            if self.reward_scorer is not None:
                self.reward_scorer.close()
            if self.rewards is not None:
                self.rewards.close()  # reward workers on Ray; in-process, nothing to stop
            if self.actors is not None:
                self.actors.close()
            if self.teacher_pools is not None:
                self.teacher_pools.close()
            if self.owns_ray:
                import ray

                ray.shutdown()
        finally:
            if self.run_log is not None:
                self.run_log.close()
            self.run_dir.release()  # last: the outputs are complete (or abandoned) by now

    def _plot_rewards(self) -> None:
        metrics_file = self.output_dir / "metrics.jsonl"
        if metrics_file.is_file():
            try:
                plot_reward_curve(metrics_file, self.output_dir / "reward_curve.png")
            except (ValueError, OSError) as err:  # too few points, a full disk: the run itself succeeded
                log.warning("no reward curve: %s", err)


def stream_advantages(items, estimator, options, streams: tuple[str, ...], group_index: torch.Tensor,
                      per_reward: dict[str, torch.Tensor]) -> LatentStreams:
    """Each latent stream's advantage from the rewards of `items` (reward.rewards) that score its
    modality, weighted by their weights and normalised on its own (`omni_rl.algos.modality_routing`)."""
    modalities = {r.name: reward_modalities(r.name, dict(r.reward_options)) for r in items}
    routes = stream_routes(modalities, streams)
    rewards = stream_rewards(per_reward, {r.name: r.weight for r in items}, routes, len(group_index))
    return routed_advantages(estimator, rewards, group_index, options.std_mode, options.eps)


def reward_specs(items) -> list[RewardSpec]:
    """The `RewardManager`'s specs of a list of `RewardItemConfig`s (reward.rewards, reward.val_rewards)."""
    return [RewardSpec(r.name, r.weight, r.required, dict(r.reward_options), r.video_frames) for r in items]


# The trainer's rollout-vs-trainer gap (max, mean); see `rollout_corr_metrics`.
GAP_KEYS = ("rollout_corr/logprob_abs_diff_max", "rollout_corr/logprob_abs_diff_mean")


def rollout_corr_metrics(old_metrics: dict[str, float], update: dict[str, float]) -> dict[str, float]:
    """The step's `rollout_corr/*`: the old-policy pass's metrics and, where that pass scored no
    sample, the gap on the update's first mini-batch, which is that same gap before the first
    optimizer step.
    """
    out = dict(old_metrics)
    if GAP_KEYS[0] not in out and FIRST_GAP_MAX_KEY in update:
        out[GAP_KEYS[0]] = update[FIRST_GAP_MAX_KEY]
        out[GAP_KEYS[1]] = update[FIRST_GAP_MEAN_KEY]
    return out


def rollout_gap(rollout_log_probs: torch.Tensor, scored: BehaviourPolicy) -> dict[str, float]:
    """How far the sampler's log-probs are from the trainer's for the same weights: the numerical
    gap between the two code paths (batching, kernels, precision), over every valid entry."""
    valid = scored.mask.bool()
    diff = (rollout_log_probs - scored.log_probs).abs()[valid]
    a, b = rollout_log_probs[valid].double(), scored.log_probs[valid].double()
    pearson = float(torch.corrcoef(torch.stack([a, b]))[0, 1]) if a.numel() > 1 and a.std() > 0 else 1.0
    return {
        GAP_KEYS[1]: float(diff.mean()),
        GAP_KEYS[0]: float(diff.max()),
        "rollout_corr/logprob_pearson": pearson,
        "rollout_corr/checked_fraction": 1.0,
    }


def run(cfg: OmniConfig) -> dict[str, float]:
    """Train with `cfg`; returns the last step's metrics."""
    return PPOTrainer(cfg).fit()

"""The PPO trainer: one on-policy loop, read top to bottom.

    prompts  -> rollout (request-batched, fp32 trajectories) -> rewards -> advantages
             -> old log-probs (recomputed, or the rollout's in bypass mode)
             -> PPO update (epochs x mini-batches, replaying the stored steps)
             -> weight sync -> log / validate / checkpoint

This module wires the stages together and owns the run's outputs; the maths lives in
`omni_rl.algos`, the family-specific parts (rollout engine, batch, replay, validation) in a
stage (`DiffusionStage`, `TextStage`), the parameters in the training engine.
Everything random is seeded from (trainer.seed, step, sample), so a resumed run repeats the
uninterrupted one exactly.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

import torch

from omni_rl.algos.advantages import AdvantageInput, get_advantage_estimator
from omni_rl.config.loader import to_yaml
from omni_rl.config.schema import OmniConfig
from omni_rl.data.prompts import PromptSampler, load_prompt_items
from omni_rl.device import pick_device, weightless_device
from omni_rl.engine.local import LocalEngine
from omni_rl.logging import MetricLogger, ProgressBar, build_sinks, plot_reward_curve
from omni_rl.models.factory import build_model
from omni_rl.reward.async_scorer import AsyncRewardScorer
from omni_rl.reward.manager import RewardManager, RewardSpec
from omni_rl.trainer.checkpoint import (
    CheckpointError,
    export_folder,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from omni_rl.trainer.diffusion_stage import DiffusionStage
from omni_rl.trainer.ppo_update import run_update, summarize
from omni_rl.trainer.text_stage import TextStage
from omni_rl.utils.atomic import atomic_directory, atomic_write_text

# Each model family brings its rollout engine, batch, actor and validation; the loop is shared.
STAGES = {"diffusion": DiffusionStage, "autoregressive": TextStage}

log = logging.getLogger(__name__)


class PPOTrainer:
    def __init__(self, cfg: OmniConfig):
        self.cfg = cfg
        t = cfg.trainer
        self.output_dir = Path(t.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(t.seed)
        # With Ray the workers hold the weights; the driver's model is a weightless view on the
        # meta device (tokenizer, processor, shapes: what building requests needs).
        self.device = pick_device(t.device) if t.backend == "local" else weightless_device()

        self.model = build_model(cfg.model, self.device, tuple(cfg.plugins))
        self.stage = STAGES[self.model.family](cfg, self.model)
        self.actor = self.stage.actor
        rc = cfg.reward
        specs = [RewardSpec(r.name, r.weight, r.required, dict(r.kwargs)) for r in rc.rewards]
        self.owns_ray = False
        if rc.num_workers > 0:
            # Reward models in their own Ray actors (and devices), scored several batches at once.
            from omni_rl.trainer.distributed import connect_ray
            from omni_rl.workers.reward_worker import RayRewardManager

            self.owns_ray = connect_ray(cfg)
            self.rewards = RayRewardManager(
                specs, cfg.plugins, rc.num_workers, rc.timeout_s, rc.worker_num_cpus, rc.worker_num_gpus
            )
        else:
            self.rewards = RewardManager(specs, plugins=cfg.plugins)
        self.reward_scorer = (
            AsyncRewardScorer(self.rewards, rc.max_batch_size, rc.max_wait_ms, num_threads=max(1, rc.num_workers))
            if rc.overlap_rollout
            else None
        )
        self.advantage_fn = get_advantage_estimator(cfg.algo.advantage)
        # backend=ray: old log-probs, updates, rollout and weight sync run on a worker group
        # (omni_rl/trainer/distributed.py); the loop below is the same.
        self.workers = None
        self.engine = None
        if t.backend == "ray":
            from omni_rl.trainer.distributed import RayWorkers

            self.workers = RayWorkers(cfg)
            self.stage.engine.close()
            self.stage.engine = self.workers.rollout_engine
        else:
            self.engine = LocalEngine(self.model, cfg.optim)

        items = load_prompt_items(cfg.data.prompts, cfg.data.prompt_file)
        self.sampler = PromptSampler(items, t.prompts_per_step, t.seed, cfg.data.shuffle)
        val_items = (
            load_prompt_items(cfg.data.val_prompts, cfg.data.val_prompt_file, "data.val_prompts")
            if cfg.data.val_prompts is not None or cfg.data.val_prompt_file is not None
            else items
        )
        self.val_items = val_items[: t.val_num_prompts]

        self.start_step = 0
        if t.resume:
            try:
                self._resume(t.resume)
            except BaseException:
                self._close_workers()
                raise
        atomic_write_text(self.output_dir / "config.yaml", to_yaml(cfg))
        self.logger = MetricLogger(
            build_sinks(
                t.loggers, self.output_dir, project=t.wandb_project, config=None,
                console_every=t.log_every, resume_from_step=self.start_step if t.resume else None,
            )
        )

    # --- the loop ------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        t = self.cfg.trainer
        bar = ProgressBar(total=t.total_steps, initial=self.start_step, disable=not t.progress_bar)
        metrics: dict[str, float] = {}
        try:
            if t.val_every and self.start_step == 0:
                self.logger.log(self.validate(0), 0)
            for step in range(self.start_step + 1, t.total_steps + 1):
                metrics = self.train_step(step)
                if t.val_every and (step % t.val_every == 0 or step == t.total_steps):
                    metrics.update(self.validate(step))
                if step % t.log_every == 0 or step == t.total_steps:
                    self.logger.log(metrics, step)
                bar.update(step, metrics)
                if (t.save_every and step % t.save_every == 0) or step == t.total_steps:
                    self.save(step)
            self.export(self.output_dir / export_folder(self.model))
        finally:
            bar.close()
            self.logger.close()
            self.stage.close()
            if self.reward_scorer is not None:
                self.reward_scorer.close()
            self._close_workers()
        self._plot_rewards()
        return metrics

    def train_step(self, step: int) -> dict[str, float]:
        if self.workers is not None:
            self.workers.step = step  # named in a failed worker's error
        timings: dict[str, float] = {}
        t0 = time.perf_counter()

        prompts = self.sampler.prompts_for_step(step - 1)
        scorer = self.reward_scorer
        batch, reward_futures = self.stage.rollout(prompts, step, scorer.submit if scorer else None)
        timings["timing/rollout"] = time.perf_counter() - t0

        # With overlap the samples were being scored during the rollout; this waits for the rest.
        t1 = time.perf_counter()
        if scorer is not None:
            reward = scorer.gather(reward_futures, self.cfg.reward.timeout_s)
        else:
            reward = self.rewards.score(*self.stage.reward_inputs(batch))
        batch.rewards = reward.total
        batch.advantages = self.advantage_fn(
            AdvantageInput(reward.total, batch.group_index, self.cfg.algo.std_mode, self.cfg.algo.adv_eps)
        )
        timings["timing/reward"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        corr = self.old_log_probs(batch)
        timings["timing/old_log_prob"] = time.perf_counter() - t2

        t3 = time.perf_counter()
        update = self.update(batch, step)
        timings["timing/update"] = time.perf_counter() - t3

        self.stage.engine.sync_weights(self.model, version=step)
        timings["timing/step"] = time.perf_counter() - t0
        timings["perf/samples_per_s"] = len(batch) / timings["timing/step"]
        return {
            **reward.metrics, **self.stage.rollout_metrics(batch), **corr, **update, **timings,
            "actor/advantage_abs_mean": float(batch.advantages.abs().mean()),
        }

    # --- stages --------------------------------------------------------------------------
    def old_log_probs(self, batch) -> dict[str, float]:
        """Fill the behaviour policy's log-probs (and means); compare with the rollout's."""
        if self.workers is not None:
            behaviour = self.workers.behaviour_policy(batch)  # each rank scores its shard
        else:
            behaviour = self.actor.behaviour_policy(batch, self.cfg.trainer.micro_batch_size)
        log_probs, valid = behaviour["log_probs"], behaviour["mask"].bool()
        if "means" in behaviour:
            batch.old_means = behaviour["means"]
        if self.cfg.algo.old_logprob_mode == "bypass":
            batch.old_log_probs = batch.rollout_log_probs
        else:
            batch.old_log_probs = log_probs
        # How far the sampler's log-probs are from the trainer's for the same weights: the
        # numerical gap between the two code paths (batching, kernels, precision).
        diff = (batch.rollout_log_probs - log_probs).abs()[valid]
        a, b = batch.rollout_log_probs[valid].double(), log_probs[valid].double()
        pearson = float(torch.corrcoef(torch.stack([a, b]))[0, 1]) if a.numel() > 1 and a.std() > 0 else 1.0
        return {
            "rollout_corr/logprob_abs_diff_mean": float(diff.mean()),
            "rollout_corr/logprob_abs_diff_max": float(diff.max()),
            "rollout_corr/logprob_pearson": pearson,
        }

    def update(self, batch, step: int) -> dict[str, float]:
        if self.workers is not None:
            return self.workers.update(batch, step)  # each rank its share of every mini-batch
        return summarize([run_update(self.engine, self.actor, batch, self.cfg, step)])

    def validate(self, step: int) -> dict[str, float]:
        return self.stage.validate(self.val_items, step, self.rewards, self.output_dir, self.logger)

    # --- outputs -------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        if self.workers is not None:
            return self.workers.save(
                self.output_dir, step, self.model, to_yaml(self.cfg), self.cfg.trainer.keep_last_checkpoints
            )
        return save_checkpoint(
            self.output_dir, step, self.engine.state_dict(), self.model, to_yaml(self.cfg),
            self.cfg.trainer.keep_last_checkpoints,
        )

    def _resume(self, path: str) -> None:
        state = load_checkpoint(path)
        if self.workers is not None:
            self.workers.load(state)
        elif "sharded" in state:
            raise CheckpointError(
                f"trainer.resume={path!r}: {state['folder']} holds a sharded checkpoint (trainer.backend=ray); "
                f"resume it with trainer.backend=ray trainer.engine=fsdp2, or export its weights with "
                f"omni_rl.trainer.distributed.export_sharded_checkpoint"
            )
        else:
            self.engine.load_state_dict(state)
        set_rng_state(state["rng"])
        self.start_step = int(state["step"])
        self.stage.engine.sync_weights(self.model, version=self.start_step)
        log.info("resumed from %s at step %d", state["folder"], self.start_step)

    def _close_workers(self) -> None:
        if self.workers is not None:
            self.workers.close()
        close_rewards = getattr(self.rewards, "close", None)  # reward workers on Ray
        if close_rewards is not None:
            close_rewards()
        if self.owns_ray:
            import ray

            ray.shutdown()

    def export(self, folder: Path) -> None:
        """The trained weights (LoRA or full) into `folder`, atomically: from this process's
        model, or with Ray from rank 0's synced rollout copy (the driver holds no weights)."""
        with atomic_directory(folder) as tmp:
            if self.workers is not None:
                self.workers.export(tmp)
            else:
                self.model.save_trained(str(tmp))

    def _plot_rewards(self) -> None:
        metrics_file = self.output_dir / "metrics.jsonl"
        if metrics_file.is_file():
            try:
                plot_reward_curve(metrics_file, self.output_dir / "reward_curve.png")
            except ValueError as err:  # too few points for a curve is not a failure of the run
                log.warning("no reward curve: %s", err)


def run(cfg: OmniConfig) -> dict[str, float]:
    """Train with `cfg`; returns the last step's metrics."""
    return PPOTrainer(cfg).fit()

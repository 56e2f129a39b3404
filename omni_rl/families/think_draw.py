"""The think-draw family: a written plan, then an image drawn from it, trained as one trajectory.

A sample is the plan's R tokens then the K trained denoising steps of an image conditioned on the
prompt and the plan (`ThinkDrawModelBase`). One reward's advantage reaches both; the update trains
the plan with a token loss (chunk 0, `plan_policy_loss`, weighted by `plan_loss_weight`) and the
steps with `algo.policy_loss` (chunks 1..K), on one `[N, R + K]` action row per sample. The image
half is the diffusion family's, composed. docs/algorithms.md (Think, then draw) has more.

Not here (refused at load): losses that read old means or train the forward process, rollout
correction, Ray workers, pipelined rollouts, non-native engines, top_p for plans.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omni_rl.algos.forward_losses import FORWARD_LOSSES
from omni_rl.algos.policy_losses import DIFFUSION_LOSSES
from omni_rl.algos.token_losses import TOKEN_LOSSES, TokenLossInput
from omni_rl.option import option
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.data.prompts import PromptItem
from omni_rl.data.think_draw_batch import ThinkDrawBatch
from omni_rl.families.autoregressive import build_token_loss, token_gap_metrics
from omni_rl.families.sampling import ThinkDrawSampling
from omni_rl.families.base import BehaviourPolicy, ModelFamily, register_family
from omni_rl.families.diffusion import DiffusionFamily, DiffusionOptions, check_kernel
from omni_rl.models.think_draw import ThinkDrawModelBase
from omni_rl.utils.seeding import derive_seed

# The token loss's metrics that keep their name: the first-mini-batch checks read them over
# every chunk, plan and image alike.
SHARED_METRICS = ("ratio_max_abs_dev",)


@dataclass
class ThinkDrawOptions(DiffusionOptions):
    """The think-draw family's options (`algo.family_options`): the image half's (the diffusion
    family's) and how the plan is trained (how it is sampled, its temperature and max_new_tokens,
    is `rollout.sampling_options`, `ThinkDrawSampling`)."""

    plan_policy_loss: str = option("ppo_clip", "The token loss of the plan's tokens (a TOKEN_LOSSES name); "
                                               "algo.policy_loss trains the image's denoising steps.")
    plan_loss_options: dict[str, Any] = option({}, "The plan loss's options (as algo.policy_loss_options for a text "
                                                   "model; its ratio clip defaults to PPO's 0.2).")
    plan_loss_weight: float = option(1.0, "The plan's loss is this times its token loss, one chunk beside the K "
                                          "image-step chunks (0 leaves the plan untrained).")

    def check(self) -> None:
        DiffusionOptions.check(self)
        if not (math.isfinite(self.plan_loss_weight) and self.plan_loss_weight >= 0):
            raise ValueError(f"plan_loss_weight={self.plan_loss_weight!r}: expected a finite value >= 0 "
                             f"(0 leaves the plan untrained)")




@register_family("think_draw")
class ThinkDrawFamily(ModelFamily):
    batch_type = ThinkDrawBatch
    sample_modalities = frozenset({"image"})  # the images (the plans are not scored)
    rollout_is_levels = ()  # refused: a plan token and a denoising step share no unit
    losses = DIFFUSION_LOSSES  # algo.policy_loss; the plan's is the option plan_policy_loss
    Options = ThinkDrawOptions
    Sampling = ThinkDrawSampling

    def __init__(self, cfg: OmniConfig, model: ThinkDrawModelBase, options: ThinkDrawOptions | None = None,
                 trains: bool = True):
        super().__init__(cfg, model, options, trains)
        self.image = DiffusionFamily(cfg, model, self.options, trains)
        # No KL term on the plan: algo.kl_coef applies to the image steps.
        self.plan_loss = build_token_loss(TOKEN_LOSSES.get(self.options.plan_policy_loss),
                                          self.options.plan_loss_options, cfg.rollout.sampling_options,
                                          kl_coef=0.0) if trains else None

    @classmethod
    def nested_option_blocks(cls, options: ThinkDrawOptions) -> tuple[tuple[str, type, str, str], ...]:
        """The plan loss's block, bound to its token loss's options (after `check_config` has
        checked that `plan_policy_loss` names a token loss)."""
        name = options.plan_policy_loss
        return (("plan_loss_options", TOKEN_LOSSES.get(name).Options, "algo.family_options.plan_loss_options",
                 f"plan loss {name}"),)

    @classmethod
    def check_config(cls, cfg: OmniConfig) -> None:
        a, t = cfg.algo, cfg.trainer
        options = cfg.algo.family_options
        check_kernel(cfg)
        if options.teachers or options.distill_coef:
            raise ConfigError("algo.family_options.teachers: expected none for a think-draw model (on-policy "
                              "distillation of its plan and image steps is not built); remove teachers and distill_coef")
        name = a.policy_loss
        trajectory = [n for n in DIFFUSION_LOSSES.names() if not DIFFUSION_LOSSES.get(n).reads_old_mean]
        if name in FORWARD_LOSSES or (name in DIFFUSION_LOSSES and DIFFUSION_LOSSES.get(name).reads_old_mean):
            why = ("trains the forward process, not the sampled trajectory the plan belongs to" if name in FORWARD_LOSSES
                   else "reads the old transition means, which the plan's token columns do not have")
            raise ConfigError(
                f"algo.policy_loss={name!r}: {why}; a think-draw model (family think_draw) trains its image steps "
                f"with a trajectory loss that reads no means: {', '.join(trajectory)}"
            )
        plan = options.plan_policy_loss
        if plan not in TOKEN_LOSSES:
            kind = "a diffusion loss" if plan in DIFFUSION_LOSSES or plan in FORWARD_LOSSES else "unknown"
            raise ConfigError(
                f"algo.family_options.plan_policy_loss={plan!r}: {kind}; the plan's actions are tokens, trained with a "
                f"token loss: {', '.join(TOKEN_LOSSES.names())}"
            )
        level = cfg.algo.rollout_correction_options.level
        if level != "none":
            raise ConfigError(f"algo.rollout_correction_options.level={level!r}: expected none for a "
                              f"think-draw model (a plan token and a denoising step have no common correction level)")
        if t.backend != "local":
            raise ConfigError(f"trainer.backend={t.backend!r}: expected local for a think-draw model (its plans are "
                              f"sampled with the driver's model, which must be the trained one)")
        r = cfg.rollout
        if r.backend != "native":
            raise ConfigError(f"rollout.backend={r.backend!r}: expected native for a think-draw model (the engine is "
                              f"handed each request's prompt+plan conditioning in this process; other engines are untested)")
        if t.pipeline != "on_policy":
            raise ConfigError(f"trainer.pipeline={t.pipeline!r}: expected on_policy for a think-draw model (the plans "
                              f"are sampled with the trained weights, never ahead of the update)")

    # --- the rollout half -----------------------------------------------------------------
    def fit_prompts(self, items: list, what: str = "data.prompts") -> list:
        return self.image.fit_prompts(items, what)

    def plan_seed(self, request_seed: int) -> int:
        """The plan's sampling seed: drawn from its request's seed alone."""
        return derive_seed(request_seed >> 32, "plan", request_seed)

    def with_plans(self, requests: list, temperature: float):
        """Sample each request's plan and put its prompt + plan encoding into the request.
        Returns (plan_ids, plan_mask, plans as text)."""
        prompts = [req.prompt for req in requests]
        ids, mask = self.model.sample_plans(prompts, [self.plan_seed(req.seed) for req in requests],
                                            self.cfg.rollout.sampling_options.max_new_tokens, temperature)
        conditioning = self.model.encode_prompts_with_plans(prompts, ids, mask, self.cfg.rollout.sampling_options.negative_prompt)
        for i, req in enumerate(requests):
            req.conditioning = conditioning.select([i])
        plans = [self.model.decode_plan(row[m.bool()].tolist()) for row, m in zip(ids, mask)]
        return ids, mask, plans

    def rollout(self, engine, prompts: list[PromptItem], step: int, score=None) -> tuple[ThinkDrawBatch, list]:
        requests, metadata, groups = self.image.rollout_requests(prompts, step)
        temperature = self.cfg.rollout.sampling_options.temperature
        ids, mask, plans = self.with_plans(requests, temperature)
        with torch.no_grad():  # the very function the trainer scores the plans with
            log_probs = self.model.plan_log_probs([req.prompt for req in requests], ids, mask, temperature).float().cpu()
        metadata = [{**m, "plan": plan} for m, plan in zip(metadata, plans)]
        image, reward_futures = self.image.run_requests(engine, requests, metadata, groups, score)
        batch = ThinkDrawBatch(prompts=[req.prompt for req in requests], plan_ids=ids, plan_mask=mask,
                               plan_rollout_log_probs=log_probs, plans=plans, plan_temperature=temperature, image=image)
        return batch, reward_futures

    def reward_inputs(self, batch: ThinkDrawBatch):
        return self.image.reward_inputs(batch.image)

    def rollout_metrics(self, batch: ThinkDrawBatch) -> dict[str, float]:
        lengths = batch.plan_mask.sum(1)
        return {
            "response/plan_length_mean": float(lengths.mean()),
            # Plans cut at rollout.sampling_options.max_new_tokens before their end token.
            "response/plan_clip_ratio": float((lengths == batch.plan_width).float().mean()),
        }

    @torch.no_grad()
    def validate(self, engine, items: list[PromptItem], step: int, rewards, output_dir: Path, logger) -> dict[str, float]:
        """Greedy plans (temperature 0), ODE images; the grid's captions and the records show the plans."""
        requests, shown = self.image.val_requests(items)
        if not requests:
            return {}
        _, _, plans = self.with_plans(requests, 0.0)
        return self.image.render_validation(engine, requests, shown, step, rewards, output_dir, logger, plans=plans)

    # --- the actor half -------------------------------------------------------------------
    def num_chunks(self, batch: ThinkDrawBatch) -> int:
        return 1 + self.image.num_chunks(batch.image)

    def plan_log_probs(self, batch: ThinkDrawBatch) -> torch.Tensor:
        return self.model.plan_log_probs(batch.prompts, batch.plan_ids, batch.plan_mask, batch.plan_temperature)

    @torch.no_grad()
    def behaviour_policy(self, batch: ThinkDrawBatch, micro_batch_size: int) -> BehaviourPolicy:
        plan = []
        for start in range(0, len(batch), micro_batch_size):
            micro = batch.select(range(start, min(start + micro_batch_size, len(batch))))
            plan.append(self.plan_log_probs(micro).float().cpu())
        image = self.image.behaviour_policy(batch.image, micro_batch_size)
        return BehaviourPolicy(torch.cat([torch.cat(plan), image.log_probs], dim=1), batch.action_mask())

    def loss(self, micro: ThinkDrawBatch, chunk: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if chunk >= 1:
            return self.image.loss(micro.image_half(), chunk - 1)
        log_prob = self.plan_log_probs(micro).float()
        device = log_prob.device
        old_log_prob = micro.old_log_probs[:, : micro.plan_width].to(device)
        mask = micro.plan_mask.to(device)
        loss, metrics = self.plan_loss(
            TokenLossInput(log_prob=log_prob, old_log_prob=old_log_prob, advantages=micro.advantages.to(device)[:, None],
                           mask=mask)
        )
        loss = self.options.plan_loss_weight * loss
        out = {(f"loss/{k}" if k in SHARED_METRICS else f"loss/plan_{k}"): v for k, v in metrics.items()}
        out["loss/plan_ratio_max_abs_dev"] = metrics["ratio_max_abs_dev"]
        out.update(token_gap_metrics(log_prob, old_log_prob, mask))
        out["loss/plan_total"] = loss.detach()
        return loss, out

    # --- the image half's own state (none for the trajectory losses allowed here) ----------
    def after_optimizer_step(self) -> None:
        self.image.after_optimizer_step()

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.image.state_tensors()

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.image.load_state_tensors(tensors)

"""The diffusion family: requests, batches, reward inputs, validation, and the replay of a trajectory.

Rollout half: each prompt becomes `samples_per_prompt` requests, each with its own seed (shared
initial noise with `same_noise_in_group`); the rewards score the decoded samples (and see the
clean latent in their metadata); validation renders ODE samples into a grid. Actor half: for a
window step j the stored x_j and x_{j+1} are fed back, and the very kernel that sampled scores
x_{j+1} under the policy's mean, so on-policy the ratio is 1. `loss(micro_batch, j)` is the
policy loss on step j's entries (with rollout-correction weights when computed) plus, with
`algo.kl_coef > 0`, the KL (`kl_form`) to the reference (LoRA off). With teachers
(`family_options.teachers`, `families.teachers`) each step's KL to its teacher's is added
(`distill_coef`), or is the whole loss (`distill_kl`). A forward-process loss makes
the family `forward_process.ForwardProcessFamily` (`variant`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from omni_rl.algos.flow_sde import StepOutput, check_step, gaussian_log_prob, get_step_kernel, step_latents
from omni_rl.algos.modality_routing import routed_loss, stream_columns
from omni_rl.algos.forward_losses import FORWARD_LOSSES
from omni_rl.algos.distill import DISTILL_LOSSES, diffusion_distill_kl
from omni_rl.algos.policy_losses import DIFFUSION_KL, DIFFUSION_LOSSES, StepLossInput, get_diffusion_kl
from omni_rl.registry import RegistryUnion
from omni_rl.option import ComponentOptions, option
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.data.diffusion_batch import DiffusionBatch
from omni_rl.data.prompts import PromptFileError, PromptItem
from omni_rl.families.base import MODEL_FAMILIES, BehaviourPolicy, ModelFamily, register_family
from omni_rl.families.forward_draws import TIMESTEP_SAMPLINGS
from omni_rl.families.sampling import DiffusionSampling
from omni_rl.families.scored_rollout import scored_rollout
from omni_rl.families.teachers import TeacherOptions, build_teachers, check_routes, check_teachers, route, teacher_step_means
from omni_rl.families.update import GAP_MAX_KEY, GAP_MEAN_KEY
from omni_rl.logging import make_grid
from omni_rl.logging.sample_media import write_video_samples
from omni_rl.logging.val_records import write_val_records
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.reward.media import MediaSamples
from omni_rl.rollout.sde_window import scheduled_sde_window
from omni_rl.rollout.types import DiffusionRequest
from omni_rl.algos import latent_streams as ls
from omni_rl.utils.atomic import atomic_save_image
from omni_rl.utils.seeding import derive_seed


@dataclass
class DiffusionOptions(ComponentOptions):
    """The diffusion family's options (`algo.family_options`)."""

    timestep_fraction: float = option(
        1.0, "DanceGRPO: each sample trains a random subset of this fraction of its stochastic steps (at least one), "
             "drawn from the sample's own seed; 1 = all.")
    kl_form: str = option("flow_grpo_code", "The per-step KL to the reference (algo.kl_coef > 0): flow_grpo_code "
                                            "(Flow-GRPO's code) or exact (the per-step Gaussian KL).")
    forward_num_timesteps: int = option(
        2, "Forward-process losses (diffusion_nft, diffusion_dpo): the (t, eps) draws per sample (pair) and update, "
           "one backward each, seeded by the sample's seed and the draw's index.")
    forward_timestep_sampling: str = option(
        "uniform", "Forward-process losses: how t is drawn, uniform in (0, 1) or logit_normal (SD3's training "
                   "distribution); both kept in [1e-3, 1 - 1e-3].")
    same_noise_in_group: bool = option(False, "Share the initial noise within a prompt's group (DanceGRPO).")
    val_num_steps: int = option(12, "Denoising steps of a validation sample (deterministic: ODE, noise 0); "
                                    "usually more than rollout.sampling_options.num_steps.")
    teachers: list[TeacherOptions] = option([], "On-policy distillation: frozen teachers that score every trained step (each "
                                      "a block of omni_rl.families.teachers.TeacherOptions: name, path, lora, "
                                      "guidance_scale, data_source, metadata_key).")
    distill_coef: float = option(0.0, "The weight of the teachers' KL beside another loss; 0 with "
                                      "algo.policy_loss=distill_kl, where it is the whole loss.")

    def check(self) -> None:
        if not (math.isfinite(self.timestep_fraction) and 0 < self.timestep_fraction <= 1):
            raise ValueError(f"timestep_fraction={self.timestep_fraction!r}: expected in (0, 1]: the share of a "
                             f"sample's stochastic steps it trains (DanceGRPO: 0.6)")
        if not (isinstance(self.val_num_steps, int) and self.val_num_steps >= 1):
            raise ValueError(f"val_num_steps={self.val_num_steps!r}: expected an integer >= 1")
        if self.kl_form not in DIFFUSION_KL:
            raise ValueError(f"kl_form={self.kl_form!r}: expected one of {', '.join(DIFFUSION_KL.names())}")
        if not (isinstance(self.forward_num_timesteps, int) and self.forward_num_timesteps >= 1):
            raise ValueError(f"forward_num_timesteps={self.forward_num_timesteps!r}: expected an integer >= 1 (the "
                             f"(t, eps) draws per sample and update, one backward each)")
        if not (math.isfinite(self.distill_coef) and self.distill_coef >= 0):
            raise ValueError(f"distill_coef={self.distill_coef!r}: expected a finite value >= 0 (0: no distillation "
                             f"term beside the loss)")
        check_teachers(self.teachers)
        if self.forward_timestep_sampling not in TIMESTEP_SAMPLINGS:
            raise ValueError(f"forward_timestep_sampling={self.forward_timestep_sampling!r}: expected one of "
                             f"{', '.join(TIMESTEP_SAMPLINGS)}")


def check_kernel(cfg: OmniConfig) -> None:
    """An ODE rollout has no log-prob: only a forward-process loss trains on its samples; a
    stochastic kernel needs noise (rollout.sampling_options.noise_level > 0) to have one."""
    a, r = cfg.algo, cfg.rollout
    if r.sampling_options.kernel != "ode" and not r.sampling_options.noise_level > 0:
        raise ConfigError(
            f"rollout.sampling_options.noise_level={r.sampling_options.noise_level!r}: expected > 0 for a stochastic kernel (training needs log-probs); "
            f"use rollout.sampling_options.kernel=ode only for evaluation"
        )
    if r.sampling_options.kernel == "ode" and a.policy_loss not in FORWARD_LOSSES:
        raise ConfigError(
            f"rollout.sampling_options.kernel={r.sampling_options.kernel!r}: expected a stochastic kernel for training with algo.policy_loss="
            f"{a.policy_loss} (sde, cps, dance_sde); ode has no log-prob (only the forward-process losses "
            f"{', '.join(FORWARD_LOSSES.names())} train on ode samples)"
        )


def check_prompt_kind(adapter_class: type[DiffusionModelBase], items: list, where: str, adapter: str) -> None:
    """The prompts read from `where` are the kind the adapter takes (source images for an editing
    model, none for text-to-image: its `check_prompt_items`), else one `PromptFileError`; run
    before the model loads (`omni_rl.cli.check_inputs`) and as the family fits the prompts."""
    try:
        adapter_class.check_prompt_items(items, where, adapter)
    except ValueError as err:  # the models layer cannot name the data layer's error
        raise PromptFileError(str(err)) from None


@register_family("diffusion")
class DiffusionFamily(ModelFamily):
    batch_type = DiffusionBatch
    rollout_is_levels = ("step", "sequence")  # a denoising step; a sample's trained steps
    losses = RegistryUnion("diffusion loss", DIFFUSION_LOSSES, FORWARD_LOSSES, DISTILL_LOSSES)
    Options = DiffusionOptions
    Sampling = DiffusionSampling

    @classmethod
    def check_config(cls, cfg: OmniConfig) -> None:
        """A stochastic kernel for the trajectory losses; a forward-process loss has no log-probs
        (no rollout correction) and no per-step KL term; offline pairs train a pairwise loss."""
        check_kernel(cfg)
        check_distillation(cfg, cfg.algo.family_options)
        a = cfg.algo
        if a.policy_loss not in FORWARD_LOSSES:
            if cfg.data.preference_file is not None:
                pairwise = [n for n in FORWARD_LOSSES.names() if FORWARD_LOSSES.get(n).pairwise]
                raise ConfigError(f"algo.policy_loss={a.policy_loss!r}: expected {' or '.join(pairwise)} with "
                                  f"data.preference_file (offline pairs train a pairwise loss only)")
            return
        loss = FORWARD_LOSSES.get(a.policy_loss)
        if cfg.data.preference_file is not None and not loss.pairwise:
            pairwise = [n for n in FORWARD_LOSSES.names() if FORWARD_LOSSES.get(n).pairwise]
            raise ConfigError(f"algo.policy_loss={a.policy_loss!r}: expected {' or '.join(pairwise)} with "
                              f"data.preference_file (offline pairs train a pairwise loss only)")
        if a.kl_coef != 0:
            raise ConfigError(
                f"algo.kl_coef={a.kl_coef!r}: expected 0 with algo.policy_loss={a.policy_loss} (a forward-process loss "
                f"has no per-step KL term; a reference-regularised one reads the reference itself): remove algo.kl_coef")
        level = cfg.algo.rollout_correction_options.level
        if level != "none":
            raise ConfigError(f"algo.rollout_correction_options.level={level!r}: expected none with "
                              f"algo.policy_loss={a.policy_loss} (it reads no log-probs, so there is nothing to correct)")
        if "ref_velocity" in loss.reads and not cfg.model.lora.enabled:
            raise ConfigError(f"model.lora.enabled={cfg.model.lora.enabled!r}: expected true with algo.policy_loss="
                              f"{a.policy_loss} (its reference policy is the base model with LoRA disabled)")

    @classmethod
    def variant(cls, cfg: OmniConfig) -> type[ModelFamily]:
        """The forward-process family for a forward-process loss (found by its registered name,
        `forward_process`: it subclasses this one); this class for a step loss."""
        return MODEL_FAMILIES.get("forward_process") if cfg.algo.policy_loss in FORWARD_LOSSES else cls

    def __init__(self, cfg: OmniConfig, model: DiffusionModelBase, options: DiffusionOptions | None = None,
                 trains: bool = True):
        super().__init__(cfg, model, options, trains)
        self.kl_form = get_diffusion_kl(self.options.kl_form)
        self.teacher_options = list(self.options.teachers)
        # Built in the actor half only: the driver's family routes prompts, it scores nothing.
        self.teachers = build_teachers(cfg, model, self.teacher_options) if trains else []

    # --- the rollout half -----------------------------------------------------------------
    def fit_prompts(self, items: list, what: str = "data.prompts") -> list:
        """All of them, once the adapter has agreed they are its kind (source images for an
        editing model, none for text-to-image: `DiffusionModelBase.check_prompt_items`)."""
        check_prompt_kind(type(self.model), items, what, self.cfg.model.adapter)
        if what == "data.prompts":
            check_routes(self.teacher_options, items, what)
        return list(items)

    def condition_images(self, item: PromptItem):
        """The prompt's source images as the model encodes them (None for text-to-image)."""
        r = self.cfg.rollout.sampling_options
        return self.model.condition_images((item.media or {}).get("images"), r.height, r.width)

    def sde_window(self, step: int) -> dict:
        """The request fields that place training step `step`'s SDE window: the configured size
        and range (each sample draws its start) under the fixed schedule, else the step's one
        window (`rollout.sampling_options.sde_window_schedule`) as a range exactly its size."""
        r = self.cfg.rollout.sampling_options
        window_range = tuple(r.sde_window_range) if r.sde_window_range else None
        options = self.cfg.rollout.sampling_options.sde_window_options
        window = scheduled_sde_window(
            r.sde_window_schedule, step, self.cfg.trainer.seed, r.num_steps, r.sde_window_size, window_range,
            options.shift, options.tau, options.min_size,
        )
        if window is None:
            return dict(sde_window_size=r.sde_window_size, sde_window_range=window_range)
        return dict(sde_window_size=window[1] - window[0], sde_window_range=window)

    def request(self, item: PromptItem, seed: int, **changes) -> DiffusionRequest:
        r = self.cfg.rollout.sampling_options
        if "images" not in changes:
            changes["images"] = self.condition_images(item)
        fields = dict(
            prompt=item.prompt, seed=seed, height=r.height, width=r.width, num_steps=r.num_steps,
            num_frames=r.num_frames, fps=r.fps,
            guidance_scale=r.guidance_scale, kernel=r.kernel, noise_level=r.noise_level,
            sde_window_size=r.sde_window_size,
            sde_window_range=tuple(r.sde_window_range) if r.sde_window_range else None,
            negative_prompt=r.negative_prompt,
        )
        fields.update(changes)
        return DiffusionRequest(**fields)

    def rollout(self, engine, prompts: list[PromptItem], step: int, score=None) -> tuple[DiffusionBatch, list]:
        """The step's batch; with `score(sample, prompt, metadata, future)` each sample is handed
        to the reward scorer the moment it is finished (the returned futures carry its rewards)."""
        requests, metadata, groups = self.rollout_requests(prompts, step)
        return self.run_requests(engine, requests, metadata, groups, score)

    def rollout_requests(self, prompts: list[PromptItem], step: int) -> tuple[list[DiffusionRequest], list[dict], list[int]]:
        """The step's requests (`samples_per_prompt` per prompt, each with its own seed), each
        sample's metadata and its group."""
        cfg, n = self.cfg, self.cfg.trainer.samples_per_prompt
        requests, metadata, groups = [], [], []
        window = self.sde_window(step)
        for g, item in enumerate(prompts):
            # A group's shared initial noise travels as its seed; the engine draws it on its device.
            noise_seed = derive_seed(cfg.trainer.seed, "group-noise", step, g) if self.options.same_noise_in_group else None
            images = self.condition_images(item)  # resized once for the group
            for k in range(n):
                seed = derive_seed(cfg.trainer.seed, "train", step, g * n + k)
                requests.append(self.request(item, seed, noise_seed=noise_seed, images=images, **window))
                metadata.append(item.metadata)
                groups.append(g)
        return requests, metadata, groups

    def run_requests(self, engine, requests: list[DiffusionRequest], metadata: list[dict], groups: list[int],
                     score=None) -> tuple[DiffusionBatch, list]:
        """The batch of `requests` sampled on `engine` (and the reward futures, with `score`)."""
        results, reward_futures = scored_rollout(
            engine, requests, [req.prompt for req in requests], metadata, score, self._reward_input,
            self.cfg.rollout.timeout_s,
        )
        batch = DiffusionBatch.from_results(results, metadata, groups, self.trained_steps(requests, results))
        batch.sample_seeds = torch.tensor([req.seed for req in requests], dtype=torch.long)
        return batch, reward_futures

    def trained_steps(self, requests: list[DiffusionRequest], results) -> torch.Tensor | None:
        """DanceGRPO's per-sample subset of the stochastic steps to train (`timestep_fraction`),
        [N, K] sorted window-step indices drawn from each sample's seed; None trains all."""
        fraction = self.options.timestep_fraction
        if fraction >= 1.0:
            return None
        width = results[0].log_probs.shape[0]
        keep = max(1, int(width * fraction))
        rows = []
        for req in requests:
            gen = torch.Generator().manual_seed(derive_seed(req.seed >> 32, "trained-steps", req.seed))
            rows.append(torch.randperm(width, generator=gen)[:keep].sort().values)
        return torch.stack(rows)

    def _reward_input(self, result, prompt: str, metadata: dict) -> tuple:
        audio = None if result.audio is None else result.audio[None]
        sample = self.reward_samples(result.image[None], result.fps, audio, result.sample_rate)
        if isinstance(sample, torch.Tensor):
            sample = sample[0]  # the scorer stacks single images itself
        return sample, prompt, self.reward_metadata(result.final_latent, metadata)

    @staticmethod
    def reward_samples(images: torch.Tensor, fps: float, audio=None, sample_rate=None):
        """What the rewards score: the images [N, H, W, C] themselves, or for video [N, T, H, W, C]
        (and sound) a `MediaSamples` with its fps (and sample rate)."""
        if images.ndim == 4 and audio is None:
            return images
        return MediaSamples(video=images, fps=fps, audio=audio, sample_rate=sample_rate)

    @staticmethod
    def reward_metadata(latent: torch.Tensor, metadata: dict) -> dict:
        """What rewards see besides the image: the prompt's metadata and the clean latent
        (for latent reward models, which skip the VAE decode)."""
        return {**metadata, "latent": latent}

    def reward_inputs(self, batch: DiffusionBatch):
        metadata = [self.reward_metadata(ls.index(batch.final_latents, i), m) for i, m in enumerate(batch.metadata)]
        return self.reward_samples(batch.images, batch.fps, batch.audio, batch.sample_rate), batch.prompts, metadata

    @torch.no_grad()
    def validate(self, engine, items: list[PromptItem], step: int, rewards, output_dir: Path, logger) -> dict[str, float]:
        """Deterministic samples (ODE, noise 0) with more steps: the same images each time for
        the same weights, so the grid shows what training changed."""
        requests, shown = self.val_requests(items)
        if not requests:
            return {}
        return self.render_validation(engine, requests, shown, step, rewards, output_dir, logger)

    def val_requests(self, items: list[PromptItem]) -> tuple[list[DiffusionRequest], list[PromptItem]]:
        """Validation's requests (ODE, noise 0, the option `val_num_steps`) and the item of each."""
        t = self.cfg.trainer
        requests, shown = [], []
        for g, item in enumerate(items):
            for k in range(t.val_samples_per_prompt):
                requests.append(
                    self.request(item, derive_seed(t.val_seed, "val", g, k), num_steps=self.options.val_num_steps,
                                 kernel="ode", noise_level=0.0, sde_window_size=0, sde_window_range=None)
                )
                shown.append(item)
        return requests, shown

    def render_validation(self, engine, requests: list[DiffusionRequest], shown: list[PromptItem], step: int, rewards,
                          output_dir: Path, logger, plans: list[str] | None = None) -> dict[str, float]:
        """Sample `requests`, score them, write the jsonl records and the grid; `val/*` metrics.
        `plans` (one per request: a think-draw model's written plan) go into the rewards'
        metadata and the records under "plan", and into the captions."""
        results = engine.generate(requests, timeout_s=self.cfg.rollout.timeout_s)
        images = torch.stack([res.image for res in results])
        audio = torch.stack([res.audio for res in results]) if results[0].audio is not None else None
        samples = self.reward_samples(images, results[0].fps, audio, results[0].sample_rate)
        extra = [{} for _ in requests] if plans is None else [{"plan": plan} for plan in plans]
        reward = rewards.score(samples, [i.prompt for i in shown], [{**i.metadata, **e} for i, e in zip(shown, extra)])
        scores = reward.total.tolist()
        write_val_records(output_dir / "samples" / f"val_step_{step:06d}.jsonl", [
            {"prompt": item.prompt, **extra[n], "seed": req.seed, "reward": scores[n],
             "scores": {name: float(v[n]) for name, v in reward.per_reward.items()},
             "groups": {name: g[n] for name, g in reward.groups.items()}}
            for n, (req, item) in enumerate(zip(requests, shown))
        ])
        captions = [f"{i.prompt} | {s:.3g}" if not e else f"{i.prompt} | {e['plan']} | {s:.3g}"
                    for i, e, s in zip(shown, extra, scores)]
        t = self.cfg.trainer
        # A success test (every score 0 or 1, as GenEval's) frames each tile right or wrong.
        marks = [s == 1.0 for s in scores] if all(s in (0.0, 1.0) for s in scores) else None
        if images.ndim == 5:  # video [N, T, H, W, C]: mp4s (with sound) and contact sheets
            write_video_samples(output_dir / "samples", step, images, results[0].fps, captions, logger,
                                audio=audio, sample_rate=results[0].sample_rate)
        else:
            nrow = max(2, t.val_samples_per_prompt)
            if requests[0].images is not None:  # an edit model: each row starts with its source image
                images, captions, nrow = with_source_column(requests, images, captions, t.val_samples_per_prompt)
                if marks is not None:  # the source tiles carry no mark
                    edits = iter(marks)
                    marks = [None if k % nrow == 0 else next(edits) for k in range(len(captions))]
            grid = make_grid(images, nrow=nrow, captions=captions, marks=marks, padding=8 if marks else 4)
            atomic_save_image(grid, output_dir / "samples" / f"val_step_{step:06d}.png")
            logger.log_image("val/samples", np.asarray(grid), step)
        return {f"val/{k}": v for k, v in reward.metrics.items()}

    # --- the actor half -------------------------------------------------------------------
    @property
    def reads_old_means(self) -> bool:
        # Modality routing scores each stream's old log-prob from the old means (the stored
        # log-probs are the joint action's, not split by stream).
        return self.loss_class.reads_old_mean or self.cfg.algo.advantage_options.modality_routing

    def train_items(self, batch: DiffusionBatch):
        self.check_steps(batch)
        return batch

    @staticmethod
    def check_steps(batch: DiffusionBatch) -> None:
        """The batch's stored sigmas and noise levels, checked once (one host sync) for every
        step `step()` replays, which then skips the kernel's per-step check."""
        if batch.kernel != "ode":
            check_step(batch.kernel, batch.sigmas, batch.sigmas_next, batch.noise_levels)

    def step(self, batch: DiffusionBatch, j: int) -> StepOutput:
        """Score window step j of every sample in `batch` under the current policy."""
        x, x_next = batch.step_latents(j)
        velocity = self.model.predict_velocity(x, batch.sigmas[:, j], batch.conditioning, batch.guidance_scale)
        device = self.model.device
        return step_latents(
            get_step_kernel(batch.kernel),
            model_output=velocity,
            sigma=batch.sigmas[:, j],
            sigma_next=batch.sigmas_next[:, j],
            sample=ls.to(x, device),
            noise_level=batch.noise_levels[:, j],
            prev_sample=ls.to(x_next, device),
            validate=False,  # check_steps did, once per batch
        )

    def num_chunks(self, batch: DiffusionBatch) -> int:
        return batch.num_train_steps  # one backward per denoising step

    @torch.no_grad()
    def behaviour_policy(self, batch: DiffusionBatch, micro_batch_size: int) -> BehaviourPolicy:
        """Log-probs [N, W] and, for the losses that read them, transition means [N, W, *latent]
        of the current weights (a 480p video latent is millions of floats a step: kept only when
        a loss needs them)."""
        keep_means = self.reads_old_means
        self.check_steps(batch)
        log_probs, means = [], []
        for start in range(0, len(batch), micro_batch_size):
            micro = batch.select(range(start, min(start + micro_batch_size, len(batch))))
            steps = [self.step(micro, j) for j in range(batch.num_train_steps)]
            log_probs.append(torch.stack([s.log_prob for s in steps], dim=1).cpu())
            if keep_means:
                means.append(ls.to(ls.stack([s.mean for s in steps], dim=1), "cpu"))
        log_probs = torch.cat(log_probs)
        return BehaviourPolicy(log_probs, torch.ones_like(log_probs), ls.cat(means) if keep_means else None)

    def loss(self, micro: DiffusionBatch, j: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = self.step(micro, j)
        device = out.log_prob.device
        dt = (micro.sigmas_next[:, j] - micro.sigmas[:, j]).to(device)
        algo = self.algo
        old_log_prob = micro.old_log_probs[:, j].to(device)
        mean = _as_tensor(out.mean)
        teacher_mean, distill = self.teacher_means(micro, j, mean) if self.teachers else (None, {})
        old_mean = None if micro.old_means is None else _as_tensor(ls.to(ls.index(micro.old_means, j, dim=1), device))
        is_weight = None if micro.rollout_is_weights is None else micro.rollout_is_weights[:, j].to(device)
        if micro.stream_advantages is None:
            loss, metrics = self.policy_loss(
                StepLossInput(
                    log_prob=out.log_prob,
                    old_log_prob=old_log_prob,
                    advantages=micro.advantages.to(device),
                    mean=mean,
                    teacher_mean=teacher_mean,
                    old_mean=old_mean,
                    std=out.std,
                    dt=dt,
                    rollout_is_weight=is_weight,
                    std_checked=True,  # the kernel's std on sigmas check_steps checked
                )
            )
        else:
            loss, metrics = self.routed_step_loss(micro, out, old_mean, dt, is_weight)
        # The loss functions name their main term `policy_loss`; the metric table calls it loss/policy.
        metrics = {("loss/policy" if k == "policy_loss" else f"loss/{k}"): v for k, v in metrics.items()}
        metrics["loss/log_prob_mean"] = out.log_prob.detach().mean()
        gap = (out.log_prob.detach() - old_log_prob).abs()
        metrics[GAP_MAX_KEY] = gap.max()
        metrics[GAP_MEAN_KEY] = gap.mean()
        if algo.kl_coef > 0:
            with torch.no_grad(), self.model.reference_policy():
                ref = self.step(micro, j)
            kl = self.kl_form(_as_tensor(out.mean), _as_tensor(ref.mean), out.std, dt).mean()
            loss = loss + algo.kl_coef * kl
            metrics["loss/kl"] = kl.detach()
        if teacher_mean is not None:
            kl = diffusion_distill_kl(mean, teacher_mean, out.std, std_checked=True)
            if self.options.distill_coef > 0:
                loss = loss + self.options.distill_coef * kl.mean()
            metrics.update(distill_metrics(kl.detach(), distill["routes"], self.teachers))
            metrics["timing/teacher"] = torch.tensor(distill["seconds"])
        metrics["loss/total"] = loss.detach()
        return loss, metrics

    def routed_step_loss(self, micro: DiffusionBatch, out: StepOutput, old_mean: torch.Tensor, dt: torch.Tensor,
                         is_weight: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The step loss of each latent stream with its own advantage (`omni_rl.algos.modality_routing`):
        its log-prob and old log-prob are the Gaussian density of its own columns of the action under
        the current and the old transition means, with the step's one std."""
        device = out.log_prob.device
        prev, mean = ls.flat(out.prev_sample).to(device), ls.flat(out.mean)
        advantages = ls.to(micro.stream_advantages, device)

        def part(name: str, cols: slice, advantage: torch.Tensor):
            return self.policy_loss(StepLossInput(
                log_prob=gaussian_log_prob(prev[:, cols], mean[:, cols], out.std),
                old_log_prob=gaussian_log_prob(prev[:, cols], old_mean[:, cols], out.std),
                advantages=advantage, mean=mean[:, cols], old_mean=old_mean[:, cols], std=out.std, dt=dt,
                rollout_is_weight=is_weight, std_checked=True,
            ))

        return routed_loss(part, stream_columns(out.prev_sample), advantages)

    def teacher_means(self, micro: DiffusionBatch, j: int, mean: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Each sample's teacher's transition mean at trained step j (`[B, ...]` like `mean`),
        with the routes and the seconds the teachers took."""
        routes = [route(self.teacher_options, m) for m in micro.metadata]
        if None in routes:  # fit_prompts refused such prompts; a producer's own prompts reach here
            check_routes(self.teacher_options, [PromptItem(p, m) for p, m in zip(micro.prompts, micro.metadata)],
                         "the step's prompts")
        teacher_mean, seconds = teacher_step_means(self.teachers, routes, micro, j, mean)
        return teacher_mean, {"routes": routes, "seconds": seconds}


def check_distillation(cfg: OmniConfig, options: DiffusionOptions) -> None:
    """Teachers are there to be used, and used by a trajectory loss: distill_kl (the KL alone)
    or another step loss with distill_coef > 0."""
    a = cfg.algo
    pure = a.policy_loss in DISTILL_LOSSES
    if pure and not options.teachers:
        raise ConfigError(f"algo.policy_loss={a.policy_loss}: expected algo.family_options.teachers (at least one "
                          f"teacher to distil from, e.g. [{{name: shapes, lora: outputs/run/lora}}])")
    if options.distill_coef > 0 and not options.teachers:
        raise ConfigError(f"algo.family_options.distill_coef={options.distill_coef!r}: expected 0 without "
                          f"algo.family_options.teachers (nothing to distil from)")
    if not options.teachers:
        return
    if a.policy_loss in FORWARD_LOSSES:
        raise ConfigError(f"algo.family_options.teachers: expected none with algo.policy_loss={a.policy_loss} (a "
                          f"forward-process loss stores no trajectory for a teacher to score); use distill_kl or a step "
                          f"loss")
    if pure and options.distill_coef > 0:
        raise ConfigError(f"algo.family_options.distill_coef={options.distill_coef!r}: expected 0 with "
                          f"algo.policy_loss={a.policy_loss} (the teachers' KL is the whole loss)")
    if not pure and options.distill_coef == 0:
        raise ConfigError(f"algo.family_options.teachers: unused with algo.policy_loss={a.policy_loss} and "
                          f"algo.family_options.distill_coef=0; set distill_coef > 0 (the KL beside the loss) or "
                          f"algo.policy_loss=distill_kl (the KL alone)")


def distill_metrics(kl: torch.Tensor, routes: list[int], teachers) -> dict[str, torch.Tensor]:
    """distill/kl over the micro-batch's samples, and distill/<teacher>/kl over each teacher's
    own (only the teachers that scored a sample here: the update averages what it is given)."""
    out = {"distill/kl": kl.mean()}
    index = torch.as_tensor(routes, device=kl.device)
    for k, teacher in enumerate(teachers):
        mine = index == k
        if bool(mine.any()):
            out[f"distill/{teacher.name}/kl"] = kl[mine].mean()
    return out


def _as_tensor(mean: ls.Latents) -> torch.Tensor:
    """What the losses read: one stream as it is, several flattened into one [B, D] action."""
    return mean if isinstance(mean, torch.Tensor) else ls.flat(mean)


def with_source_column(requests: list[DiffusionRequest], images: torch.Tensor, captions: list[str], per_prompt: int):
    """The validation grid of an editing model: each prompt's row is its source image (resized to
    the output's size) followed by its `per_prompt` edits. Returns (tiles, captions, per row)."""
    from PIL import Image

    height, width = images.shape[1:3]
    tiles, labels = [], []
    for start in range(0, len(requests), per_prompt):
        source = Image.fromarray(requests[start].images[0].numpy()).resize((width, height), Image.BICUBIC)
        tiles.append(torch.from_numpy(np.asarray(source, dtype=np.uint8).copy()))
        labels.append("source")
        tiles.extend(images[start : start + per_prompt])
        labels.extend(captions[start : start + per_prompt])
    return torch.stack(tiles), labels, per_prompt + 1

"""Cross-field rules of the config, checked once at load time.

Type and key checks come from the schema; this module checks what a type cannot say: sizes that
must divide, windows inside the step count, names of registered components, value ranges. Each
failure is a `ConfigError` naming the key, the bad value and what was expected.
"""
from __future__ import annotations

import math

from omni_rl.config.schema import OmniConfig
from omni_rl.errors import OmniConfigError


# The losses of `omni_rl.algos.forward_losses.FORWARD_LOSSES` (this layer imports nothing above
# it; a test keeps the two the same): they read no log-probs, so any kernel may sample for them.
FORWARD_PROCESS_LOSSES = ("diffusion_dpo", "diffusion_nft")
# `omni_rl.families.forward_draws.TIMESTEP_SAMPLINGS` and `omni_rl.algos.forward_losses.NFT_WEIGHTINGS`.
FORWARD_TIMESTEP_SAMPLINGS = ("uniform", "logit_normal")
NFT_WEIGHTINGS = ("velocity", "adaptive_x0")


class ConfigError(OmniConfigError):
    """A bad config value; the message names the key and what was expected."""


def _require(ok: bool, key: str, value, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r}: expected {expected}")


def validate_config(cfg: OmniConfig) -> None:
    t, r, a, o = cfg.trainer, cfg.rollout, cfg.algo, cfg.optim
    for key, value in [
        ("trainer.total_steps", t.total_steps),
        ("trainer.prompts_per_step", t.prompts_per_step),
        ("trainer.samples_per_prompt", t.samples_per_prompt),
        ("trainer.mini_batch_size", t.mini_batch_size),
        ("trainer.micro_batch_size", t.micro_batch_size),
        ("trainer.log_every", t.log_every),
        ("trainer.val_num_steps", t.val_num_steps),
        ("rollout.num_steps", r.num_steps),
        ("rollout.max_num_seqs", r.max_num_seqs),
        ("rollout.num_frames", r.num_frames),
        ("algo.ppo_epochs", a.ppo_epochs),
        ("model.lora.rank", cfg.model.lora.rank),
        ("model.max_sequence_length", cfg.model.max_sequence_length),
    ]:
        _require(value >= 1, key, value, "an integer >= 1")
    for key, value in [
        ("trainer.val_every", t.val_every),
        ("trainer.save_every", t.save_every),
        ("trainer.val_num_prompts", t.val_num_prompts),
        ("trainer.val_samples_per_prompt", t.val_samples_per_prompt),
        ("rollout.sde_window_size", r.sde_window_size),
        ("trainer.keep_last_checkpoints", t.keep_last_checkpoints),
    ]:
        _require(value >= 0, key, value, "an integer >= 0")

    _require(t.output_dir.strip() != "", "trainer.output_dir", t.output_dir,
             "a folder path (an empty one would write into the current folder), e.g. outputs/run")

    samples = t.prompts_per_step * t.samples_per_prompt
    _require(
        samples % t.mini_batch_size == 0,
        "trainer.mini_batch_size", t.mini_batch_size,
        f"a divisor of prompts_per_step * samples_per_prompt = {samples}",
    )
    _require(
        t.mini_batch_size % t.micro_batch_size == 0,
        "trainer.micro_batch_size", t.micro_batch_size,
        f"a divisor of trainer.mini_batch_size = {t.mini_batch_size}",
    )
    for key, value in [("rollout.height", r.height), ("rollout.width", r.width)]:
        _require(value >= 8 and value % 8 == 0, key, value, "a positive multiple of 8 pixels")

    window = r.sde_window_size or r.num_steps
    _require(
        window <= r.num_steps, "rollout.sde_window_size", r.sde_window_size,
        f"at most rollout.num_steps = {r.num_steps} (0 means every step)",
    )
    if r.sde_window_range is not None:
        rng = list(r.sde_window_range)
        _require(
            len(rng) == 2 and 0 <= rng[0] < rng[1] <= r.num_steps,
            "rollout.sde_window_range", rng, f"[lo, hi) with 0 <= lo < hi <= rollout.num_steps = {r.num_steps}",
        )
        _require(
            rng[1] - rng[0] >= window, "rollout.sde_window_range", rng,
            f"a range at least sde_window_size = {window} steps wide",
        )
    _validate_window_schedule(r)
    _require(r.noise_level >= 0 and math.isfinite(r.noise_level), "rollout.noise_level", r.noise_level, "a finite value >= 0")
    _require(r.kernel == "ode" or r.noise_level > 0, "rollout.noise_level", r.noise_level,
             "> 0 for a stochastic kernel (training needs log-probs); use rollout.kernel=ode only for evaluation")
    _require(r.kernel != "ode" or a.policy_loss in FORWARD_PROCESS_LOSSES, "rollout.kernel", r.kernel,
             f"a stochastic kernel for training with algo.policy_loss={a.policy_loss} (sde, cps, dance_sde); ode has "
             f"no log-prob (only the forward-process losses {', '.join(FORWARD_PROCESS_LOSSES)} train on ode samples)")
    _require(r.guidance_scale >= 1.0, "rollout.guidance_scale", r.guidance_scale, ">= 1.0 (1.0 disables CFG)")
    _require(r.max_wait_ms >= 0, "rollout.max_wait_ms", r.max_wait_ms, ">= 0")
    _require(r.fps > 0 and math.isfinite(r.fps), "rollout.fps", r.fps, "a frame rate > 0, e.g. 16 (Wan2.2) or 24 (LTX-2)")
    _require(0 < a.timestep_fraction <= 1, "algo.timestep_fraction", a.timestep_fraction,
             "in (0, 1]: the share of a sample's stochastic steps it trains (DanceGRPO: 0.6)")
    _require(r.timeout_s > 0, "rollout.timeout_s", r.timeout_s, "> 0 seconds")
    _require(r.server_timeout_s > 0, "rollout.server_timeout_s", r.server_timeout_s, "> 0 seconds")
    _require(r.server_startup_timeout_s > 0, "rollout.server_startup_timeout_s", r.server_startup_timeout_s, "> 0 seconds")
    _require(r.python is None or r.python.strip() != "", "rollout.python", r.python,
             "a path to a Python interpreter, or null for this one")
    _require(0 < r.vllm_gpu_memory_utilization <= 1, "rollout.vllm_gpu_memory_utilization",
             r.vllm_gpu_memory_utilization, "a share of the GPU's memory in (0, 1], e.g. 0.5")
    _require(r.backend != "vllm" or r.top_p == 1.0, "rollout.top_p", r.top_p,
             "1.0 with rollout.backend=vllm (vLLM's log-probs renormalise over the top-p nucleus, the "
             "trainer's do not); use rollout.backend=native for top_p < 1")

    _require(a.std_mode in ("group", "global", "none"), "algo.std_mode", a.std_mode, "one of group, global, none")
    _require(a.old_logprob_mode in ("auto", "recompute", "bypass"), "algo.old_logprob_mode", a.old_logprob_mode,
             "one of auto, recompute, bypass")
    _validate_rollout_is(a)
    _validate_forward_process(cfg)
    _validate_preference_file(cfg)
    _require(a.logprob_check_every >= 0, "algo.logprob_check_every", a.logprob_check_every, "an integer >= 0 (0 = never)")
    _require(a.clip_range > 0, "algo.clip_range", a.clip_range, "> 0")
    _require(a.plan_clip_range > 0, "algo.plan_clip_range", a.plan_clip_range, "> 0 (PPO's 0.2)")
    _require(a.plan_loss_weight >= 0 and math.isfinite(a.plan_loss_weight), "algo.plan_loss_weight",
             a.plan_loss_weight, "a finite value >= 0 (0 leaves the plan untrained)")
    _require(a.clip_range_high is None or a.clip_range_high > 0, "algo.clip_range_high", a.clip_range_high, "> 0 or null")
    _require(a.adv_clip_max > 0, "algo.adv_clip_max", a.adv_clip_max, "> 0")
    _require(a.kl_coef >= 0, "algo.kl_coef", a.kl_coef, ">= 0")
    _require(
        a.kl_coef == 0 or cfg.model.lora.enabled, "algo.kl_coef", a.kl_coef,
        "0 when model.lora.enabled=false (the reference policy is the base model with LoRA disabled)",
    )
    _require(r.temperature > 0, "rollout.temperature", r.temperature, "> 0")
    _require(0 < r.top_p <= 1, "rollout.top_p", r.top_p, "in (0, 1]")
    _require(r.max_new_tokens >= 1, "rollout.max_new_tokens", r.max_new_tokens, ">= 1")
    agg_modes = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
    _require(a.loss_agg_mode in agg_modes, "algo.loss_agg_mode", a.loss_agg_mode, f"one of {', '.join(agg_modes)}")
    _require(a.loss_scale_factor is None or a.loss_scale_factor > 0, "algo.loss_scale_factor", a.loss_scale_factor,
             "> 0 (Dr.GRPO's response length budget), or null for rollout.max_new_tokens")
    _require(a.loss_scale_factor is None or a.loss_agg_mode == "seq-mean-token-sum-norm", "algo.loss_scale_factor",
             a.loss_scale_factor, f"null with algo.loss_agg_mode={a.loss_agg_mode} (only seq-mean-token-sum-norm "
             f"reads it); remove it or set that mode")
    _require(a.clip_ratio_c is None or a.clip_ratio_c > 1, "algo.clip_ratio_c", a.clip_ratio_c,
             "> 1 (the dual clip caps a negative-advantage token's loss at -A * clip_ratio_c; verl uses 3.0), "
             "or null for no dual clip")
    _require(a.clip_ratio_c is None or a.policy_loss in ("ppo_clip", "dapo"), "algo.clip_ratio_c", a.clip_ratio_c,
             f"null with algo.policy_loss={a.policy_loss} (the dual clip is an option of ppo_clip and dapo only)")
    _require(a.kl_estimator in ("k1", "k3"), "algo.kl_estimator", a.kl_estimator, "one of k1, k3")
    _require(a.kl_clamp is None or a.kl_clamp > 0, "algo.kl_clamp", a.kl_clamp,
             "> 0 (verl clamps k3 at 10), or null for no clamp")
    _require(o.lr > 0, "optim.lr", o.lr, "> 0")
    _require(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), "optim.betas", list(o.betas), "two values in [0, 1)")
    _require(o.max_grad_norm > 0, "optim.max_grad_norm", o.max_grad_norm, "> 0")
    _require(cfg.model.dtype in ("float32", "bfloat16", "float16"), "model.dtype", cfg.model.dtype,
             "one of float32, bfloat16, float16")
    _require(cfg.model.lora.init in ("gaussian", "default"), "model.lora.init", cfg.model.lora.init,
             "one of gaussian, default")
    _validate_ltx2_guidance(cfg)
    _validate_distribution(cfg)
    _validate_pipeline(cfg)
    _require(len(cfg.reward.rewards) >= 1, "reward.rewards", [], "at least one reward")
    _require(cfg.reward.max_batch_size >= 1, "reward.max_batch_size", cfg.reward.max_batch_size, ">= 1")
    _require(cfg.reward.max_wait_ms >= 0, "reward.max_wait_ms", cfg.reward.max_wait_ms, ">= 0")
    _require(cfg.reward.timeout_s > 0, "reward.timeout_s", cfg.reward.timeout_s, "> 0 seconds")
    _require(cfg.reward.num_workers >= 0, "reward.num_workers", cfg.reward.num_workers, ">= 0 (0 = in the trainer)")
    _require(cfg.reward.worker_num_cpus >= 0 and cfg.reward.worker_num_gpus >= 0, "reward.worker_num_cpus",
             (cfg.reward.worker_num_cpus, cfg.reward.worker_num_gpus), "worker_num_cpus and worker_num_gpus >= 0")
    _require(cfg.reward.val_rewards is None or len(cfg.reward.val_rewards) >= 1, "reward.val_rewards", [],
             "at least one reward, or null (validate with reward.rewards)")
    for key, items in (("reward.rewards", cfg.reward.rewards), ("reward.val_rewards", cfg.reward.val_rewards or [])):
        for i, item in enumerate(items):
            _require(math.isfinite(item.weight), f"{key}[{i}].weight", item.weight, "a finite number")
            _require(item.video_frames is None or item.video_frames >= 1, f"{key}[{i}].video_frames",
                     item.video_frames, "an integer >= 1 (frames of each video an image reward scores), or null")
        names = [item.name for item in items]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        _require(not duplicated, key, duplicated, "each reward listed once (merge the entries and add their weights)")
    _require(
        cfg.data.prompts is not None or cfg.data.prompt_file is not None or cfg.data.preference_file is not None,
        "data.prompts", None, "a list of prompts, or data.prompt_file (or data.preference_file for offline DPO)",
    )
    _require(cfg.data.prompts is None or len(cfg.data.prompts) > 0, "data.prompts", [], "at least one prompt")
    _require(cfg.data.max_prompt_tokens is None or cfg.data.max_prompt_tokens >= 1, "data.max_prompt_tokens",
             cfg.data.max_prompt_tokens, "an integer >= 1, or null for the model's context less rollout.max_new_tokens")
    _require(cfg.data.overlong_prompts in ("error", "truncate", "drop"), "data.overlong_prompts",
             cfg.data.overlong_prompts, "one of error, truncate, drop")
    _require(cfg.model.lora.alpha > 0, "model.lora.alpha", cfg.model.lora.alpha, "> 0")
    _require(o.eps > 0, "optim.eps", o.eps, "> 0")
    _require(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, ">= 0")
    _require(a.adv_eps > 0, "algo.adv_eps", a.adv_eps, "> 0")
    _require(a.kl_threshold >= 0, "algo.kl_threshold", a.kl_threshold, ">= 0")
    size = cfg.model.condition_image_size
    if size is not None:
        _require(len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size), "model.condition_image_size",
                 list(size), "[height, width] in px (two positive integers), or null for the output's size")


def _validate_window_schedule(r) -> None:
    """`rollout.sde_window_schedule` and the options only its schedules read (a value other
    than the default under a schedule that ignores it is refused, not silently dropped)."""
    schedules = ("fixed", "progressive", "random", "decay")  # omni_rl/rollout/sde_window.py
    schedule = r.sde_window_schedule
    _require(schedule in schedules, "rollout.sde_window_schedule", schedule, f"one of {', '.join(schedules)}")
    _require(schedule == "fixed" or r.sde_window_size > 0, "rollout.sde_window_schedule", schedule,
             "fixed with rollout.sde_window_size=0 (every step is stochastic: there is no window to move); "
             "set rollout.sde_window_size, e.g. 2")
    readers = {"sde_window_shift": ("progressive",), "sde_window_tau": ("progressive", "decay"),
               "sde_window_min_size": ("decay",)}
    for key, used_by in readers.items():
        value = getattr(r, key)
        _require(isinstance(value, int) and value >= 1, f"rollout.{key}", value, "an integer >= 1")
        _require(value == 1 or schedule in used_by, f"rollout.{key}", value,
                 f"1 (its default) with rollout.sde_window_schedule={schedule}: only {' and '.join(used_by)} "
                 f"read it; remove it or set the schedule")
    _require(r.sde_window_min_size <= max(r.sde_window_size, 1), "rollout.sde_window_min_size", r.sde_window_min_size,
             f"at most rollout.sde_window_size = {r.sde_window_size}")


def _validate_forward_process(cfg: OmniConfig) -> None:
    """The forward-process losses' options, and what they cannot combine with: they have no
    log-probs (no rollout correction) and no per-step KL term."""
    a = cfg.algo
    _require(isinstance(a.forward_num_timesteps, int) and a.forward_num_timesteps >= 1, "algo.forward_num_timesteps",
             a.forward_num_timesteps, "an integer >= 1 (the (t, eps) draws per sample and update, one backward each)")
    _require(a.forward_timestep_sampling in FORWARD_TIMESTEP_SAMPLINGS, "algo.forward_timestep_sampling",
             a.forward_timestep_sampling, f"one of {', '.join(FORWARD_TIMESTEP_SAMPLINGS)}")
    _require(math.isfinite(a.nft_beta) and a.nft_beta > 0, "algo.nft_beta", a.nft_beta, "a finite value > 0 (DiffusionNFT: 1)")
    _require(0 <= a.nft_ema_decay < 1, "algo.nft_ema_decay", a.nft_ema_decay,
             "in [0, 1) (the old policy's EMA: ema <- d ema + (1 - d) theta; e.g. 0.9)")
    _require(a.nft_weighting in NFT_WEIGHTINGS, "algo.nft_weighting", a.nft_weighting, f"one of {', '.join(NFT_WEIGHTINGS)}")
    _require(math.isfinite(a.dpo_beta) and a.dpo_beta > 0, "algo.dpo_beta", a.dpo_beta,
             "a finite value > 0 (Diffusion-DPO: 5000)")
    if a.policy_loss not in FORWARD_PROCESS_LOSSES:
        return
    _require(a.kl_coef == 0, "algo.kl_coef", a.kl_coef,
             f"0 with algo.policy_loss={a.policy_loss} (a forward-process loss has no per-step KL term; "
             f"diffusion_dpo is regularised towards the reference by algo.dpo_beta): remove algo.kl_coef")
    _require(a.rollout_is == "none", "algo.rollout_is", a.rollout_is,
             f"none with algo.policy_loss={a.policy_loss} (it reads no log-probs, so there is nothing to correct)")
    _require(a.policy_loss != "diffusion_dpo" or cfg.model.lora.enabled, "model.lora.enabled", cfg.model.lora.enabled,
             "true with algo.policy_loss=diffusion_dpo (its reference policy is the base model with LoRA disabled)")


def _validate_preference_file(cfg: OmniConfig) -> None:
    """Offline Diffusion-DPO (`data.preference_file`): the file's pairs replace the rollout, so
    the step trains pairs, with the pairwise loss, in this process, and nothing else names the
    training prompts."""
    d, t = cfg.data, cfg.trainer
    if d.preference_file is None:
        return
    _require(d.preference_file.strip() != "", "data.preference_file", d.preference_file,
             "a JSONL file of {prompt, chosen, rejected} rows, or null")
    _require(cfg.algo.policy_loss == "diffusion_dpo", "algo.policy_loss", cfg.algo.policy_loss,
             "diffusion_dpo with data.preference_file (offline pairs train the pairwise DPO loss only)")
    for key, value in (("data.prompts", d.prompts), ("data.prompt_file", d.prompt_file)):
        _require(value is None, key, value,
                 "null with data.preference_file (the pairs' prompts are the training prompts); set it to null")
    _require(t.samples_per_prompt == 1, "trainer.samples_per_prompt", t.samples_per_prompt,
             "1 with data.preference_file (each step trains trainer.prompts_per_step pairs of the file)")
    _require(t.pipeline == "on_policy", "trainer.pipeline", t.pipeline,
             "on_policy with data.preference_file (there is no rollout to run ahead)")


def _validate_rollout_is(a) -> None:
    """The rollout correction's values. Which levels a model takes (token/sequence for text,
    step/sequence for diffusion) depends on its adapter's family, checked by `omni_rl.compose`."""
    levels = ("none", "token", "sequence", "step")
    _require(a.rollout_is in levels, "algo.rollout_is", a.rollout_is,
             f"one of {', '.join(levels)} (token or sequence for text models, step or sequence for diffusion)")
    _require(a.rollout_is_mode in ("truncate", "mask"), "algo.rollout_is_mode", a.rollout_is_mode,
             "one of truncate (clamp the weight at algo.rollout_is_cap), mask (drop the action above it)")
    _require(math.isfinite(a.rollout_is_cap) and a.rollout_is_cap >= 1, "algo.rollout_is_cap", a.rollout_is_cap,
             "a finite value >= 1 (identical log-probs give weight 1; Yao et al. use 2)")
    _require(a.rollout_is == "none" or a.old_logprob_mode != "bypass", "algo.old_logprob_mode", a.old_logprob_mode,
             f"auto or recompute with algo.rollout_is={a.rollout_is} (the correction weighs the trainer's "
             f"recomputed old log-probs against the rollout's; bypass uses the rollout's as the old ones, "
             f"so every weight would be 1): set algo.old_logprob_mode=auto or algo.rollout_is=none")


def _validate_ltx2_guidance(cfg: OmniConfig) -> None:
    """LTX-2's guidance terms: each scale at or above its off value (whether the model takes
    them, and STG's block list, the adapter checks)."""
    m = cfg.model
    for key, value, low, off in [
        ("model.guidance_rescale", m.guidance_rescale, 0.0, "0 = off"),
        ("model.audio_guidance_rescale", m.audio_guidance_rescale, 0.0, "0 = off"),
        ("model.stg_scale", m.stg_scale, 0.0, "0 = off"),
        ("model.audio_stg_scale", m.audio_stg_scale, 0.0, "0 = off"),
        ("model.modality_scale", m.modality_scale, 1.0, "1 = off"),
        ("model.audio_modality_scale", m.audio_modality_scale, 1.0, "1 = off"),
    ]:
        if value is not None:
            _require(math.isfinite(value) and value >= low, key, value, f"a finite value >= {low:g} ({off})")
    _require(all(isinstance(b, int) and b >= 0 for b in m.stg_blocks), "model.stg_blocks", list(m.stg_blocks),
             "zero-based transformer block indices (integers >= 0)")


# The most weight versions a sample may lag the weights it trains (trainer.max_staleness). The
# async producer keeps that many steps of rollouts ready or queued (and, past total_steps, their
# tickets for a resumed run): the bound keeps that small, and samples more updates old than this
# are far off-policy (published async RL runs use 1 to 8).
MAX_STALENESS = 64


def check_max_staleness(value, key: str = "trainer.max_staleness") -> None:
    """ConfigError (one line) for a staleness bound over MAX_STALENESS; `key` names it."""
    _require(not isinstance(value, int) or value <= MAX_STALENESS, key, value,
             f"at most {MAX_STALENESS} (the async producer keeps that many steps of rollouts ready or queued, "
             f"and samples that many updates old are far off-policy; runs use 1 to 8)")


def _validate_pipeline(cfg: OmniConfig) -> None:
    """The staleness bound and what happens beyond it. Which pipelines exist, and which rollout
    backends can sample beside the trainer, `omni_rl.compose` checks against their registries."""
    t = cfg.trainer
    _require(isinstance(t.max_staleness, int) and t.max_staleness >= 0, "trainer.max_staleness", t.max_staleness,
             "an integer >= 0 (weight versions a sample may lag the weights it trains; 0 = on-policy)")
    check_max_staleness(t.max_staleness)
    _require(t.stale_policy in ("drop", "reroll"), "trainer.stale_policy", t.stale_policy,
             "one of drop (leave stale groups out), reroll (sample them again with the current weights)")
    _require(t.pipeline != "one_step_off" or t.max_staleness >= 1, "trainer.max_staleness", t.max_staleness,
             ">= 1 with trainer.pipeline=one_step_off (its samples are one weight version old by construction); "
             "use trainer.pipeline=on_policy for fresh samples")


def _validate_distribution(cfg: OmniConfig) -> None:
    """The resource pool and worker timeouts. Which backends and engines exist, and the rules a
    backend keeps for itself, are checked by `omni_rl.compose` against their registries."""
    t = cfg.trainer
    _require(t.nnodes >= 1, "trainer.nnodes", t.nnodes, "an integer >= 1")
    _require(t.devices_per_node >= 1, "trainer.devices_per_node", t.devices_per_node, "an integer >= 1")
    _require(t.worker_timeout_s > 0, "trainer.worker_timeout_s", t.worker_timeout_s, "> 0 seconds")
    _require(t.worker_startup_timeout_s > 0, "trainer.worker_startup_timeout_s", t.worker_startup_timeout_s,
             "> 0 seconds")
    _require(t.weight_sync_bucket_mb >= 1, "trainer.weight_sync_bucket_mb", t.weight_sync_bucket_mb, ">= 1 MiB")

"""Cross-field rules of the config, checked once at load time.

Type and key checks come from the schema; this module checks what a type cannot say: sizes that
must divide, windows inside the step count, value ranges. Each failure is a `ConfigError` naming
the key, the bad value and what was expected. It names no component: a loss's, an estimator's
and a model family's own rules are theirs (their options' `check()`, the family's `check_config`),
run by `omni_rl.compose` at load; so are the sampling knobs' (`rollout.sampling_options`, the
family's `Sampling.check()`).
"""
from __future__ import annotations

import math

from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError


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
        ("rollout.max_num_seqs", r.max_num_seqs),
        ("algo.ppo_epochs", a.ppo_epochs),
        ("model.lora.rank", cfg.model.lora.rank),
    ]:
        _require(value >= 1, key, value, "an integer >= 1")
    for key, value in [
        ("trainer.val_every", t.val_every),
        ("trainer.save_every", t.save_every),
        ("trainer.val_num_prompts", t.val_num_prompts),
        ("trainer.val_samples_per_prompt", t.val_samples_per_prompt),
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
    _require(r.timeout_s > 0, "rollout.timeout_s", r.timeout_s, "> 0 seconds")

    _require(a.old_logprob_mode in ("auto", "recompute", "bypass"), "algo.old_logprob_mode", a.old_logprob_mode,
             "one of auto, recompute, bypass")
    _validate_preference_file(cfg)
    _require(a.logprob_check_every >= 0, "algo.logprob_check_every", a.logprob_check_every, "an integer >= 0 (0 = never)")
    _require(a.kl_coef >= 0, "algo.kl_coef", a.kl_coef, ">= 0")
    _require(
        a.kl_coef == 0 or cfg.model.lora.enabled, "algo.kl_coef", a.kl_coef,
        "0 when model.lora.enabled=false (the reference policy is the base model with LoRA disabled)",
    )
    _require(o.lr > 0, "optim.lr", o.lr, "> 0")
    _require(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), "optim.betas", list(o.betas), "two values in [0, 1)")
    _require(o.max_grad_norm > 0, "optim.max_grad_norm", o.max_grad_norm, "> 0")
    _require(cfg.model.dtype in ("float32", "bfloat16", "float16"), "model.dtype", cfg.model.dtype,
             "one of float32, bfloat16, float16")
    _require(cfg.model.lora.init in ("gaussian", "default"), "model.lora.init", cfg.model.lora.init,
             "one of gaussian, default")
    _require(cfg.trainer.weight_sync_bucket_mb >= 1, "trainer.weight_sync_bucket_mb", cfg.trainer.weight_sync_bucket_mb,
             ">= 1 MiB")
    _require(len(cfg.reward.rewards) >= 1, "reward.rewards", [], "at least one reward")
    _require(cfg.reward.max_batch_size >= 1, "reward.max_batch_size", cfg.reward.max_batch_size, ">= 1")
    _require(cfg.reward.max_wait_ms >= 0, "reward.max_wait_ms", cfg.reward.max_wait_ms, ">= 0")
    _require(cfg.reward.timeout_s > 0, "reward.timeout_s", cfg.reward.timeout_s, "> 0 seconds")
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
    _require(cfg.model.lora.alpha > 0, "model.lora.alpha", cfg.model.lora.alpha, "> 0")
    _require(o.eps > 0, "optim.eps", o.eps, "> 0")
    _require(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, ">= 0")


def _validate_preference_file(cfg: OmniConfig) -> None:
    """Offline pairs (`data.preference_file`): the file's pairs replace the rollout, so the step
    trains pairs in this process, and nothing else names the training prompts. Which loss trains
    them (a pairwise one) the model family checks (`check_config`)."""
    d, t = cfg.data, cfg.trainer
    if d.preference_file is None:
        return
    _require(d.preference_file.strip() != "", "data.preference_file", d.preference_file,
             "a JSONL file of {prompt, chosen, rejected} rows, or null")
    for key, value in (("data.prompts", d.prompts), ("data.prompt_file", d.prompt_file)):
        _require(value is None, key, value,
                 "null with data.preference_file (the pairs' prompts are the training prompts); set it to null")
    _require(t.samples_per_prompt == 1, "trainer.samples_per_prompt", t.samples_per_prompt,
             "1 with data.preference_file (each step trains trainer.prompts_per_step pairs of the file)")

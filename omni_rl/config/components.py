"""Checks that every component the config names is registered, at load time.

A typo in `algo.policy_loss` or a reward name should fail before minutes of model loading, with
the registered names in the message. This is the one place where `omni_rl.config` looks at the
registries above it; the imports are inside the function so that the schema itself stays the
bottom layer, and plugins (the `omni_rl.plugins` entry points and `cfg.plugins`) are loaded
first so a user's own rewards and adapters count.
"""
from __future__ import annotations

import re

from omni_rl.config.schema import OmniConfig
from omni_rl.config.validate import ConfigError

ROLLOUT_BACKENDS = ("native",)
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?|npu(:\d+)?)$")


def check_components(cfg: OmniConfig) -> None:
    from omni_rl.algos import ADVANTAGE_ESTIMATORS, DIFFUSION_KL, POLICY_LOSSES, STEP_KERNELS
    from omni_rl.logging import SINK_NAMES
    from omni_rl.models.registry import ADAPTERS, adapter_key
    from omni_rl.plugins import PluginError, load_plugins
    from omni_rl.reward.registry import REWARDS, RewardConfigError, check_reward_options

    try:
        load_plugins(cfg.plugins)
    except PluginError as err:
        raise ConfigError(f"plugins={list(cfg.plugins)!r}: {err}") from None
    for key, registry, value in [
        ("model.adapter", ADAPTERS, adapter_key(cfg.model.adapter, cfg.model.stage)),
        ("rollout.kernel", STEP_KERNELS, cfg.rollout.kernel),
        ("algo.advantage", ADVANTAGE_ESTIMATORS, cfg.algo.advantage),
        ("algo.policy_loss", POLICY_LOSSES, cfg.algo.policy_loss),
        ("algo.kl_form", DIFFUSION_KL, cfg.algo.kl_form),
    ]:
        if value not in registry:
            raise ConfigError(f"{key}={value!r}: unknown {registry.kind}; registered: {', '.join(registry.names())}")
    # A group-relative estimator gives every sample of a one-sample group advantage 0: the run would
    # log loss 0 and grad norm 0 on every step and learn nothing.
    from omni_rl.algos.advantages import needs_group

    samples, estimator = cfg.trainer.samples_per_prompt, cfg.algo.advantage
    if samples < 2 and needs_group(estimator):
        groupless = [name for name in ADVANTAGE_ESTIMATORS.names() if not needs_group(name)]
        alternative = f", or use an algo.advantage that needs no group: {', '.join(groupless)}" if groupless else ""
        raise ConfigError(
            f"trainer.samples_per_prompt={samples!r}: expected >= 2 with algo.advantage={estimator!r}, which "
            f"compares each sample with the other samples of its prompt, so a group of one gets advantage 0 "
            f"(loss 0, grad norm 0) on every step; set trainer.samples_per_prompt to 2 or more (GRPO recipes "
            f"use 8-16){alternative}"
        )
    if cfg.rollout.backend not in ROLLOUT_BACKENDS:
        raise ConfigError(
            f"rollout.backend={cfg.rollout.backend!r}: expected one of {', '.join(ROLLOUT_BACKENDS)} "
            f"(vllm_omni arrives with the GPU serving work)"
        )
    for i, item in enumerate(cfg.reward.rewards):
        key = f"reward.rewards[{i}]"
        if item.name not in REWARDS:
            raise ConfigError(f"{key}.name={item.name!r}: unknown reward; registered: {', '.join(REWARDS.names())}")
        try:
            check_reward_options(item.name, dict(item.kwargs))
        except RewardConfigError as err:
            raise ConfigError(f"{key}.kwargs: {err}") from None
    unknown = [name for name in cfg.trainer.loggers if name not in SINK_NAMES]
    if unknown:
        raise ConfigError(f"trainer.loggers={list(cfg.trainer.loggers)!r}: unknown {unknown}; valid: {', '.join(SINK_NAMES)}")
    if not _DEVICE.match(cfg.trainer.device):
        raise ConfigError(f"trainer.device={cfg.trainer.device!r}: expected auto, cpu, cuda[:N] or npu[:N]")

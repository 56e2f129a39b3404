"""The agent options' rules at config load (`omni_rl.compose` runs them around binding the tools'
and the environment's options): names registered, a model and a rollout backend that can run
trajectories, limits that fit together. Each failure is one `ConfigError` line naming the key."""
from __future__ import annotations

from omni_rl.agent.components import ENVIRONMENTS, TOOLS
from omni_rl.agent.options import AgentOptions
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.models.autoregressive import AutoregressiveModelBase
from omni_rl.rollout.backends import ROLLOUT_BACKENDS

KEY = "algo.family_options.agent_options"


def check_agent_names(agent: AgentOptions) -> None:
    """Every tool and the environment are registered (before their options are bound)."""
    for i, item in enumerate(agent.tools):
        if item["name"] not in TOOLS:
            raise ConfigError(f"{KEY}.tools[{i}].name={item['name']!r}: unknown tool; registered: "
                              f"{', '.join(TOOLS.names()) or 'none'} (a tools plugin may be missing from `plugins`)")
    if agent.environment is not None and agent.environment not in ENVIRONMENTS:
        raise ConfigError(f"{KEY}.environment={agent.environment!r}: unknown environment; registered: "
                          f"{', '.join(ENVIRONMENTS.names()) or 'none'}")


def check_agent_config(cfg: OmniConfig, agent: AgentOptions, adapter_class: type) -> None:
    if not (isinstance(adapter_class, type) and issubclass(adapter_class, AutoregressiveModelBase)
            and adapter_class.takes_tools):
        raise ConfigError(f"{KEY}: model.adapter={cfg.model.adapter} cannot run an agent's trajectories (a language "
                          f"model whose adapter sets takes_tools: its chat template shows tools and tool turns); "
                          f"use a causal LM such as Qwen3ForCausalLM, or remove the agent options")
    backend = ROLLOUT_BACKENDS.get(cfg.rollout.backend)
    if not backend.multi_turn:
        able = ", ".join(n for n in ROLLOUT_BACKENDS.names() if ROLLOUT_BACKENDS.get(n).multi_turn)
        raise ConfigError(f"{KEY} with rollout.backend={cfg.rollout.backend}: that backend does not sample multi-turn "
                          f"trajectories; use one that does ({able})")
    max_new = cfg.rollout.sampling_options.max_new_tokens
    if max_new > agent.max_total_tokens:
        raise ConfigError(f"rollout.sampling_options.max_new_tokens={max_new} is over {KEY}.max_total_tokens="
                          f"{agent.max_total_tokens} (the whole trajectory's budget); lower it or raise the budget")
    if cfg.algo.family_options.routing_replay != "off":
        raise ConfigError(f"algo.family_options.routing_replay={cfg.algo.family_options.routing_replay} with {KEY}: "
                          f"multi-turn rollout records no routed experts; set routing_replay=off")

"""The `agent:` block's rules at config load (`omni_rl.compose` runs them): names registered,
options bound to each tool's and environment's `Options`, limits in range, and a model and
rollout backend that can run trajectories. Each failure is one `ConfigError` line naming the key."""
from __future__ import annotations

import math

from omni_rl.agent.components import ENVIRONMENTS, TOOLS
from omni_rl.config.options import bind_options
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.models.autoregressive import AutoregressiveModelBase
from omni_rl.rollout.backends import ROLLOUT_BACKENDS

TURN_REWARD_MODES = ("sum", "discounted")


def check_agent_config(cfg: OmniConfig, adapter_class: type) -> None:
    a = cfg.agent
    if not a.enabled:
        return
    for i, item in enumerate(a.tools):
        key = f"agent.tools[{i}]"
        if item.name not in TOOLS:
            raise ConfigError(f"{key}.name={item.name!r}: unknown tool; registered: {', '.join(TOOLS.names()) or 'none'} "
                              f"(a tools plugin may be missing from `plugins`)")
        # Checked here; the mapping stays in the config (a list's items are not options blocks the
        # written config turns back into mappings) and the agent family binds it when it builds the tool.
        bind_options(TOOLS.get(item.name).Options, item.tool_options, f"{key}.tool_options", f"tool {item.name}")
    names = [item.name for item in a.tools]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"agent.tools: {', '.join(repeated)} listed twice; list each tool once (the model calls it by name)")
    if a.environment is not None:
        if a.environment not in ENVIRONMENTS:
            raise ConfigError(f"agent.environment={a.environment!r}: unknown environment; registered: "
                              f"{', '.join(ENVIRONMENTS.names()) or 'none'}")
        options_class = ENVIRONMENTS.get(a.environment).Options
        if type(a.environment_options) is not options_class:
            a.environment_options = bind_options(options_class, a.environment_options, "agent.environment_options",
                                                 f"environment {a.environment}")
    for key, value, low in [("max_turns", a.max_turns, 1), ("max_total_tokens", a.max_total_tokens, 1),
                            ("max_tool_output_chars", a.max_tool_output_chars, 1), ("tool_threads", a.tool_threads, 1)]:
        if not isinstance(value, int) or value < low:
            raise ConfigError(f"agent.{key}={value!r}: expected an integer >= {low}")
    if not (isinstance(a.tool_timeout_s, (int, float)) and math.isfinite(a.tool_timeout_s) and a.tool_timeout_s > 0):
        raise ConfigError(f"agent.tool_timeout_s={a.tool_timeout_s!r}: expected a finite number of seconds > 0")
    if a.turn_reward not in TURN_REWARD_MODES:
        raise ConfigError(f"agent.turn_reward={a.turn_reward!r}: expected one of {', '.join(TURN_REWARD_MODES)}")
    if not 0 <= a.discount <= 1:
        raise ConfigError(f"agent.discount={a.discount!r}: expected in [0, 1]")
    if not (isinstance(adapter_class, type) and issubclass(adapter_class, AutoregressiveModelBase)
            and adapter_class.takes_tools):
        raise ConfigError(f"agent: model.adapter={cfg.model.adapter} cannot run an agent's trajectories (a language "
                          f"model whose adapter sets takes_tools: its chat template shows tools and tool turns); "
                          f"use a causal LM such as Qwen3ForCausalLM, or remove the agent block")
    backend = ROLLOUT_BACKENDS.get(cfg.rollout.backend)
    if not backend.multi_turn:
        able = ", ".join(n for n in ROLLOUT_BACKENDS.names() if ROLLOUT_BACKENDS.get(n).multi_turn)
        raise ConfigError(f"agent: rollout.backend={cfg.rollout.backend} does not sample multi-turn trajectories; "
                          f"use one that does ({able})")
    max_new = cfg.algo.family_options.max_new_tokens
    if max_new > a.max_total_tokens:
        raise ConfigError(f"algo.family_options.max_new_tokens={max_new} is over agent.max_total_tokens="
                          f"{a.max_total_tokens} (the whole trajectory's budget); lower it or raise the budget")
    if cfg.algo.family_options.routing_replay != "off":
        raise ConfigError(f"algo.family_options.routing_replay={cfg.algo.family_options.routing_replay} with an agent "
                          f"block: multi-turn rollout records no routed experts; set routing_replay=off")

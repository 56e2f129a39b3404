"""Multi-turn agentic rollout: trajectories of model turns and tool / environment turns.

`components` (Tool, Environment and their registries), `runner` (a call with a timeout and an
output cap), `chat` (the template's tool-call format), `trajectory` (the readable record),
`loop` (the sessions the rollout engine's `generate_turns` consults after each model turn). The
shipped tools and environments are plugins in the top-level `agent_tools` package.
"""
from omni_rl.agent.components import (
    ENVIRONMENTS, TOOLS, EnvStep, Environment, Observation, Tool, ToolCall, ToolCallRecord, Turn, register_environment,
    register_tool,
)
from omni_rl.agent.trajectory import Trajectory

__all__ = [
    "ENVIRONMENTS", "TOOLS", "EnvStep", "Environment", "Observation", "Tool", "ToolCall", "ToolCallRecord",
    "Trajectory", "Turn", "register_environment", "register_tool",
]

"""Qwen3-MoE's view for the planner: the causal LM's weightless build, traced as a text model."""
from __future__ import annotations

from adapters.plan.qwen3 import _plan_load_trained
from omni_rl.plan.spec import PlanSpec, register_plan_spec

register_plan_spec("Qwen3MoeForCausalLM", PlanSpec(_plan_load_trained, modality="text"))

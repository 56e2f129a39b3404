"""The planner's view of `adapters/qwen3.py` (`omni_rl.plan.spec`): the decoder built from its
config alone, traced through `forward_logits` (omni_rl/plan/text_steps.py)."""
from __future__ import annotations

from omni_rl.plan.spec import PlanSpec, register_plan_spec

from adapters.qwen3 import ARCHITECTURES


def _plan_load_trained(adapter) -> None:
    """The decoder alone from the folder's config.json (a snapshot's tokenizer is not needed)."""
    from transformers import AutoModelForCausalLM

    adapter.model = adapter.load_pretrained(AutoModelForCausalLM)


for _architecture in ARCHITECTURES:
    # Traced through forward_logits (omni_rl/plan/text_steps.py); positions come from the mask.
    register_plan_spec(_architecture, PlanSpec(_plan_load_trained, modality="text"))

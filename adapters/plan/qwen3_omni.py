"""The planner's view of `adapters/qwen3_omni.py` (`omni_rl.plan.spec`): its network built without
weights, and the inputs of one traced forward."""
from __future__ import annotations

import torch

from omni_rl.models.registry import adapter_key
from omni_rl.plan.spec import PlanSpec, register_plan_spec


def _plan_load_trained(adapter) -> None:
    """The thinker alone from the checkpoint's `thinker_config` (what `strip_for_training`
    keeps): the full model's build needs talker keys a config-only folder may lack."""
    from transformers import AutoConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerForConditionalGeneration

    from omni_rl.device import weightless_device

    config = AutoConfig.from_pretrained(adapter.path).thinker_config
    with weightless_device():
        thinker = Qwen3OmniMoeThinkerForConditionalGeneration(config)
    adapter.thinker = adapter.model = thinker.to(adapter.dtype)
    # What forward_logits reads beside the network (set from the same config in __init__).
    adapter.placeholder_token_ids = [config.image_token_id, config.video_token_id, config.audio_token_id]


def _plan_text_positions(batch: int, length: int) -> torch.Tensor:
    """A text-only batch's multimodal positions: all three axes count the tokens (what
    `rope_positions` gives text, without its data-dependent search for image runs)."""
    return torch.arange(length).expand(3, batch, length)


# Traced with fake tensors: transformers' grouped experts route tokens with shapes that do not
# depend on the routing (the default `experts_implementation`; its fake kernel needs bf16).
register_plan_spec(adapter_key("Qwen3OmniMoeForConditionalGeneration", "thinker"),
                   PlanSpec(_plan_load_trained, modality="text", text_positions=_plan_text_positions))

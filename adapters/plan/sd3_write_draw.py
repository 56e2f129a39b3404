"""The planner's view of `adapters/sd3_write_draw.py`: SD3's, plus the writer's forward where the
writer trains. The trace keeps the larger of the two models' passes (the update runs the writer's
chunk and the image's steps one after the other); both models' weights, gradients and optimizer
states are counted by the weightless build, which builds the writer too."""
from __future__ import annotations

import torch

from adapters.plan.sd3 import _plan_forward_inputs, _plan_load_trained
from omni_rl.models.write_draw import WRITER_GROUP
from omni_rl.plan.spec import PlanSpec, register_plan_spec


def _forward_inputs(adapter, cfg, batch: int) -> dict:
    inputs = _plan_forward_inputs(adapter, cfg, batch)
    if adapter.trains_writer:
        # The writer's context and its whole text, as the update scores them (teacher forced).
        width = adapter.options.writer.max_prompt_tokens + cfg.rollout.sampling_options.max_new_tokens
        inputs[WRITER_GROUP] = dict(input_ids=torch.zeros(batch, width, dtype=torch.long),
                                    attention_mask=torch.ones(batch, width, dtype=torch.long))
    return inputs


register_plan_spec("StableDiffusion3Pipeline/write_draw", PlanSpec(_plan_load_trained, _forward_inputs))

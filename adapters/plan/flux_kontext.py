"""The planner's view of `adapters/flux_kontext.py` (`omni_rl.plan.spec`): its network built without
weights, and the inputs of one traced forward."""
from __future__ import annotations

import torch

from omni_rl.plan.spec import PlanSpec, register_plan_spec

from adapters.flux import PACK, image_ids
from adapters.plan.flux import _plan_load_trained


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    """FLUX.1's forward with the source image's tokens (at `model.adapter_options.condition_image_size`,
    else the output's size) appended to the noise tokens."""
    from adapters.plan.flux import _plan_forward_inputs as flux_inputs

    inputs = flux_inputs(adapter, cfg, batch)["transformer"]
    options = cfg.model.adapter_options
    size = options.condition_image_size or [cfg.rollout.sampling_options.height, cfg.rollout.sampling_options.width]
    ch, cw = int(size[0]) // adapter.vae_scale, int(size[1]) // adapter.vae_scale
    hidden = inputs["hidden_states"]
    source = torch.empty(batch, (ch // PACK) * (cw // PACK), hidden.shape[-1], dtype=hidden.dtype)
    inputs["hidden_states"] = torch.cat([hidden, source], dim=1)
    inputs["img_ids"] = torch.cat([inputs["img_ids"], image_ids(ch, cw, first=1.0).to(inputs["img_ids"].dtype)])
    return {"transformer": inputs}


register_plan_spec("FluxKontextPipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs))

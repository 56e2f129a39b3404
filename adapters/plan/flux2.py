"""The planner's view of `adapters/flux2.py` (`omni_rl.plan.spec`): its network built without
weights, and the inputs of one traced forward."""
from __future__ import annotations

import torch

from omni_rl.plan.spec import PlanSpec, register_plan_spec

from adapters.flux2 import PATCH, image_ids, text_ids


def _plan_load_trained(adapter) -> None:
    from diffusers import Flux2Transformer2DModel

    adapter.transformer = adapter.load_pretrained(Flux2Transformer2DModel, "transformer")
    adapter.vae_scale = 8  # AutoencoderKLFlux2: 8x spatially (four blocks), 32 latent channels


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    """The forward `predict_velocity` runs: the prompt at `max_sequence_length` tokens (all of
    them attended to, as in the pipeline)."""
    from omni_rl.plan.spec import prompt_tokens

    c = adapter.transformer.config
    h, w = cfg.rollout.sampling_options.height // (adapter.vae_scale * PATCH), cfg.rollout.sampling_options.width // (adapter.vae_scale * PATCH)
    tokens = prompt_tokens(cfg)
    guidance = torch.empty(batch, dtype=adapter.dtype) if c.guidance_embeds else None
    return {"transformer": dict(
        hidden_states=torch.empty(batch, h * w, c.in_channels, dtype=adapter.dtype),
        encoder_hidden_states=torch.empty(batch, tokens, c.joint_attention_dim, dtype=adapter.dtype),
        timestep=torch.empty(batch, dtype=adapter.dtype),
        img_ids=image_ids(h, w), txt_ids=text_ids(tokens), guidance=guidance,
        return_dict=False,
    )}


register_plan_spec("Flux2KleinPipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs))
register_plan_spec("Flux2Pipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs))

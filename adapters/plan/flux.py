"""The planner's view of `adapters/flux.py` (`omni_rl.plan.spec`): its network built without
weights, and the inputs of one traced forward."""
from __future__ import annotations

import torch

from omni_rl.plan.spec import PlanSpec, register_plan_spec

from adapters.flux import PACK, image_ids


def _plan_load_trained(adapter) -> None:
    from diffusers import FluxTransformer2DModel

    adapter.transformer = adapter.load_pretrained(FluxTransformer2DModel, "transformer")
    adapter.vae_scale = 8  # FLUX.1's VAE: 8x spatially, 16 latent channels


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    """The packed forward `predict_velocity` runs: T5's `max_sequence_length` tokens, CLIP's
    pooled vector, the guidance embedding."""
    from omni_rl.plan.spec import prompt_tokens

    c = adapter.transformer.config
    h, w = cfg.rollout.sampling_options.height // adapter.vae_scale, cfg.rollout.sampling_options.width // adapter.vae_scale
    tokens = prompt_tokens(cfg)
    return {"transformer": dict(
        hidden_states=torch.empty(batch, (h // PACK) * (w // PACK), c.in_channels, dtype=adapter.dtype),
        timestep=torch.empty(batch, dtype=adapter.dtype),
        guidance=torch.empty(batch) if c.guidance_embeds else None,
        pooled_projections=torch.empty(batch, c.pooled_projection_dim, dtype=adapter.dtype),
        encoder_hidden_states=torch.empty(batch, tokens, c.joint_attention_dim, dtype=adapter.dtype),
        txt_ids=torch.zeros(tokens, 3, dtype=adapter.dtype),
        img_ids=image_ids(h, w).to(adapter.dtype),
        return_dict=False,
    )}


register_plan_spec("FluxPipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs))

"""The planner's view of `adapters/z_image.py` (`omni_rl.plan.spec`): its network built without
weights, and the inputs of one traced forward."""
from __future__ import annotations

import torch

from omni_rl.plan.spec import PlanSpec, register_plan_spec


def _plan_load_trained(adapter) -> None:
    from diffusers import ZImageTransformer2DModel

    adapter.transformer = adapter.load_pretrained(ZImageTransformer2DModel, "transformer")
    adapter.patch = adapter.transformer.config.all_patch_size[0]
    adapter.vae_scale = 8  # Z-Image's VAE (FLUX's): 8x spatially, 16 latent channels


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    """The forward `predict_velocity` runs: one [16, 1, h, w] latent and one caption of
    `max_sequence_length` tokens (the longest the encoder lets through) per sample."""
    from omni_rl.plan.spec import prompt_tokens

    c = adapter.transformer.config
    h, w = cfg.rollout.sampling_options.height // adapter.vae_scale, cfg.rollout.sampling_options.width // adapter.vae_scale
    tokens = prompt_tokens(cfg)
    return {"transformer": dict(
        x=[torch.empty(c.in_channels, 1, h, w, dtype=adapter.dtype) for _ in range(batch)],
        t=torch.empty(batch, dtype=adapter.dtype),
        cap_feats=[torch.empty(tokens, c.cap_feat_dim, dtype=adapter.dtype) for _ in range(batch)],
        return_dict=False,
    )}


register_plan_spec("ZImagePipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs))

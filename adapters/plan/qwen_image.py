"""The planner's view of `adapters/qwen_image.py` (`omni_rl.plan.spec`): its network built without
weights, and the inputs of one traced forward."""
from __future__ import annotations

import torch

from omni_rl.plan.spec import PlanSpec, register_plan_spec


def _plan_load_trained(adapter) -> None:
    from diffusers import QwenImageTransformer2DModel

    adapter.transformer = adapter.load_pretrained(QwenImageTransformer2DModel, "transformer")
    adapter.patch = adapter.transformer.config.patch_size
    adapter.vae_scale = 8  # Qwen-Image's VAE (Wan2.1's): 8x spatially, 16 latent channels


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    """The packed forward `predict_velocity` runs; the prompt at `max_sequence_length` tokens
    (the longest the pipeline lets through, the prefix dropped)."""
    from omni_rl.plan.spec import prompt_tokens

    c, p = adapter.transformer.config, adapter.patch
    h, w = cfg.rollout.sampling_options.height // adapter.vae_scale, cfg.rollout.sampling_options.width // adapter.vae_scale
    tokens = prompt_tokens(cfg)
    return {"transformer": dict(
        hidden_states=torch.empty(batch, (h // p) * (w // p), c.in_channels, dtype=adapter.dtype),
        timestep=torch.empty(batch, dtype=adapter.dtype),
        encoder_hidden_states=torch.empty(batch, tokens, c.joint_attention_dim, dtype=adapter.dtype),
        encoder_hidden_states_mask=torch.ones(batch, tokens, dtype=torch.long),
        img_shapes=[[(1, h // p, w // p)]] * batch,
        return_dict=False,
    )}


register_plan_spec("QwenImagePipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs))

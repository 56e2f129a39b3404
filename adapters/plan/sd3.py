"""The planner's view of `adapters/sd3.py` (`omni_rl.plan.spec`): its network built without weights,
and the inputs of one traced forward."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from omni_rl.plan.spec import PlanSpec, register_plan_spec


# CLIP-L/G's 77 tokens are concatenated with T5's `max_sequence_length` (diffusers' encode_prompt).
_CLIP_TOKENS = 77


def _plan_load_trained(adapter) -> None:
    from diffusers import SD3Transformer2DModel

    adapter.transformer = adapter.load_pretrained(SD3Transformer2DModel, "transformer")
    # The SD3 VAE's factor (2 ** (4 blocks - 1)), read from its config when the folder has one.
    vae = Path(adapter.path) / "vae" / "config.json"
    adapter.vae_scale = 2 ** (len(json.loads(vae.read_text())["block_out_channels"]) - 1) if vae.is_file() else 8


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    from omni_rl.plan.spec import prompt_tokens

    c = adapter.transformer.config
    h, w = cfg.rollout.sampling_options.height // adapter.vae_scale, cfg.rollout.sampling_options.width // adapter.vae_scale
    return {"transformer": dict(
        hidden_states=torch.empty(batch, c.in_channels, h, w, dtype=adapter.dtype),
        timestep=torch.empty(batch),
        encoder_hidden_states=torch.empty(batch, _CLIP_TOKENS + prompt_tokens(cfg), c.joint_attention_dim, dtype=adapter.dtype),
        pooled_projections=torch.empty(batch, c.pooled_projection_dim, dtype=adapter.dtype),
        return_dict=False,
    )}


register_plan_spec("StableDiffusion3Pipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs))

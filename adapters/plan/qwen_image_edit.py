"""The planner's view of `adapters/qwen_image_edit.py` (`omni_rl.plan.spec`): its network built
without weights, and the inputs of one traced forward."""
from __future__ import annotations

import torch

from omni_rl.plan.spec import PlanSpec, register_plan_spec

from adapters.plan.qwen_image import _plan_load_trained as _plan_load_qwen_image


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    """The forward `predict_velocity` runs, with one source image: the noise tokens, then the
    source's VAE tokens at `model.adapter_options.condition_image_size` (default the output's size), and
    the prompt at `max_sequence_length` tokens (the longest the pipeline lets through; the
    source's vision tokens are part of it). An Edit-Plus prompt with three sources has two more
    condition grids than planned here."""
    from omni_rl.plan.spec import prompt_tokens

    c, p, f = adapter.transformer.config, adapter.patch, adapter.vae_scale
    h, w = cfg.rollout.sampling_options.height // f, cfg.rollout.sampling_options.width // f
    size = cfg.model.adapter_options.condition_image_size
    ch, cw = (size[0] // f, size[1] // f) if size is not None else (h, w)
    image_tokens = (h // p) * (w // p) + (ch // p) * (cw // p)
    tokens = prompt_tokens(cfg)
    return {"transformer": dict(
        hidden_states=torch.empty(batch, image_tokens, c.in_channels, dtype=adapter.dtype),
        timestep=torch.empty(batch, dtype=adapter.dtype),
        encoder_hidden_states=torch.empty(batch, tokens, c.joint_attention_dim, dtype=adapter.dtype),
        encoder_hidden_states_mask=torch.ones(batch, tokens, dtype=torch.long),
        img_shapes=[[(1, h // p, w // p), (1, ch // p, cw // p)]] * batch,
        return_dict=False,
    )}


def _plan_latent_numel(adapter, cfg) -> int:
    """The noise latent alone: the source's tokens are conditioning, stored once per sample."""
    c, f = adapter.transformer.config, adapter.vae_scale
    return (c.in_channels // adapter.patch ** 2) * (cfg.rollout.sampling_options.height // f) * (cfg.rollout.sampling_options.width // f)


# The edit models' transformer is Qwen-Image's; the forward adds the source image's tokens.
for _name in ("QwenImageEditPipeline", "QwenImageEditPlusPipeline"):
    register_plan_spec(_name, PlanSpec(_plan_load_qwen_image, _plan_forward_inputs, latent_numel=_plan_latent_numel))

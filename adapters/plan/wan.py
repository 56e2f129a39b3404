"""The planner's view of `adapters/wan.py` (`omni_rl.plan.spec`): its network built without weights,
and the inputs of one traced forward."""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch

from omni_rl.plan.spec import PlanSpec, register_plan_spec


def _plan_load_trained(adapter) -> None:
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    root = Path(adapter.path)
    index = json.loads((root / "model_index.json").read_text())
    adapter.transformer = adapter.load_pretrained(WanTransformer3DModel, "transformer")
    two = isinstance(index.get("transformer_2"), list) and all(index["transformer_2"]) and (root / "transformer_2").is_dir()
    adapter.transformer_2 = adapter.load_pretrained(WanTransformer3DModel, "transformer_2") if two else None
    # The config as the class reads it: a key the file omits (Wan2.1's VAE has no scale factors)
    # takes the class's default.
    defaults = {k: v.default for k, v in inspect.signature(AutoencoderKLWan.__init__).parameters.items()}
    adapter.plan_vae = {**defaults, **AutoencoderKLWan.load_config(str(root), subfolder="vae")}
    adapter.expand_timesteps = bool(index.get("expand_timesteps", False))


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    """Each expert's forward as `_guided` runs it, the prompt zero-padded to max_sequence_length."""
    from omni_rl.plan.spec import prompt_tokens

    vae = adapter.plan_vae or adapter.vae.config
    t, s = vae["scale_factor_temporal"], vae["scale_factor_spatial"]
    frames, h, w = (cfg.rollout.sampling_options.num_frames - 1) // t + 1, cfg.rollout.sampling_options.height // s, cfg.rollout.sampling_options.width // s
    out = {}
    for name, expert in adapter.trainable_modules().items():
        c = expert.config
        p_t, p_h, p_w = c.patch_size
        tokens = (frames // p_t) * (h // p_h) * (w // p_w)
        out[name] = dict(
            hidden_states=torch.empty(batch, c.in_channels, frames, h, w, dtype=adapter.dtype),
            timestep=torch.empty(batch, tokens) if adapter.expand_timesteps else torch.empty(batch),
            encoder_hidden_states=torch.empty(batch, prompt_tokens(cfg), c.text_dim, dtype=adapter.dtype),
            return_dict=False,
        )
    return out


register_plan_spec("WanPipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs))

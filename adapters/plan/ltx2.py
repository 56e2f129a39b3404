"""The planner's view of `adapters/ltx2.py` (`omni_rl.plan.spec`): its network built without
weights, and the inputs of one traced forward."""
from __future__ import annotations

import torch

from omni_rl.plan.spec import PlanSpec, register_plan_spec


def _plan_load_trained(adapter) -> None:
    """The transformer, and the two VAEs as meta skeletons: their configs give the latent grid
    (`latent_shape`); they are frozen, not trained, and their weights are not counted here."""
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel

    adapter.transformer = adapter.load_pretrained(LTX2VideoTransformer3DModel, "transformer")
    adapter.vae = adapter.load_pretrained(AutoencoderKLLTX2Video, "vae")
    adapter.audio_vae = adapter.load_pretrained(AutoencoderKLLTX2Audio, "audio_vae")


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    """`_forward`'s call at the recipe's geometry: the video and audio tokens of `latent_shape`, the
    connectors' text at `max_sequence_length` tokens per stream, and one row per guidance term the
    recipe turns on (uncond, cond, STG: `predict_velocity`'s `rows`). The modality-isolation
    forward, when on, is a second forward of the cond rows alone, smaller than this one."""
    from omni_rl.plan.spec import prompt_tokens
    from omni_rl.plan.steps import cfg_copies

    c, r = adapter.transformer.config, cfg.rollout
    adapter.options = cfg.model.adapter_options
    terms = adapter.guidance(r.sampling_options.guidance_scale).values()
    rows = 1 + any(t.cfg > 1.0 for t in terms) + any(t.stg > 0.0 for t in terms)
    rows_total = batch // cfg_copies(cfg) * rows
    shapes = adapter.latent_shape(r.sampling_options.height, r.sampling_options.width, r.sampling_options.num_frames)
    (_, frames, h, w), (channels, length, mel) = shapes["video"], shapes["audio"]
    tokens = prompt_tokens(cfg)
    video_dim, audio_dim = ((c.caption_channels, c.caption_channels) if c.use_prompt_embeddings else
                            (c.num_attention_heads * c.attention_head_dim, c.audio_num_attention_heads * c.audio_attention_head_dim))
    timestep = torch.empty(rows_total, dtype=torch.float32)
    return {"transformer": dict(
        hidden_states=torch.empty(rows_total, frames * h * w, c.in_channels, dtype=adapter.dtype),
        audio_hidden_states=torch.empty(rows_total, length, channels * mel, dtype=adapter.dtype),
        encoder_hidden_states=torch.empty(rows_total, tokens, video_dim, dtype=adapter.dtype),
        audio_encoder_hidden_states=torch.empty(rows_total, tokens, audio_dim, dtype=adapter.dtype),
        timestep=timestep, sigma=timestep,
        encoder_attention_mask=torch.ones(rows_total, tokens, dtype=torch.long),
        audio_encoder_attention_mask=torch.ones(rows_total, tokens, dtype=torch.long),
        num_frames=frames, height=h, width=w, fps=adapter.frame_rate, audio_num_frames=length,
        use_cross_timestep=True, return_dict=False,
    )}


def _plan_latent_numel(adapter, cfg) -> int:
    """Both streams of one sample's latent."""
    import math

    shapes = adapter.latent_shape(cfg.rollout.sampling_options.height, cfg.rollout.sampling_options.width, cfg.rollout.sampling_options.num_frames)
    return sum(math.prod(shape) for shape in shapes.values())


register_plan_spec("LTX2Pipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs, latent_numel=_plan_latent_numel))

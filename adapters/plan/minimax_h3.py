"""The planner's view of `adapters/minimax_h3.py` (`omni_rl.plan.spec`): its network built without weights, and the inputs of one traced forward."""
from __future__ import annotations

import torch

from omni_rl.plan.spec import PlanSpec, register_plan_spec


def _plan_load_trained(adapter) -> None:
    """The transformer, and the two VAEs and schedulers as meta skeletons / configs: they give the
    latent grid (`latent_shape`); the VAEs are frozen, not trained, and not counted here."""
    from diffusers import (
        AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel,
    )

    adapter.transformer = adapter.load_pretrained(MiniMaxH3Transformer3DModel, "transformer")
    adapter.vae = adapter.load_pretrained(AutoencoderKLMiniMaxH3, "vae")
    adapter.audio_vae = adapter.load_pretrained(AutoencoderKLMiniMaxH3Audio, "audio_vae")
    adapter.scheduler = MiniMaxH3Scheduler.from_pretrained(adapter.path, subfolder="scheduler")
    adapter.audio_scheduler = MiniMaxH3Scheduler.from_pretrained(adapter.path, subfolder="audio_scheduler")


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    """`_forward`'s transformer call at the recipe's geometry: one packed sequence per sample of
    `max_sequence_length` text rows, then the 2 x L audio rows, then the video rows (the pipeline's
    `t2va` order), at two timesteps (video, audio). Guidance-distilled: one row per sample. The
    positions' values change no FLOPs, so they are zeros (no data-dependent shapes)."""
    from adapters.minimax_h3 import AUDIO_TAG, TEXT_TAG, VIDEO_TAG
    from omni_rl.plan.spec import prompt_tokens

    c, r = adapter.transformer.config, cfg.rollout
    adapter.options = cfg.model.adapter_options
    shapes = adapter.latent_shape(r.sampling_options.height, r.sampling_options.width, r.sampling_options.num_frames)
    (channels, frames, h, w), (stereo, length, latent_a) = shapes["video"], shapes["audio"]
    pt, ph, pw = c.patch_size
    video_rows = frames // pt * (h // ph) * (w // pw)
    text, audio = prompt_tokens(cfg), stereo * length
    total = text + audio + video_rows
    tags = torch.cat([torch.full((text,), TEXT_TAG), torch.full((audio,), AUDIO_TAG), torch.full((video_rows,), VIDEO_TAG)])
    return {"transformer": dict(
        hidden_states=torch.empty(batch, video_rows, channels * pt * ph * pw, dtype=adapter.dtype),
        audio_hidden_states=torch.empty(batch, audio, latent_a, dtype=adapter.dtype),
        encoder_hidden_states=torch.empty(batch, text, c.text_dim, dtype=adapter.dtype),
        timestep=torch.empty(2, dtype=torch.float32),
        timestep_indices=torch.cat([torch.zeros(text, dtype=torch.long), torch.ones(audio, dtype=torch.long),
                                    torch.zeros(video_rows, dtype=torch.long)]),
        token_tags=tags.to(torch.long), position_ids=torch.zeros(total, 3, dtype=torch.float32),
        text_indices=torch.arange(text), audio_indices=torch.arange(text, text + audio),
        video_indices=torch.arange(text + audio, total), return_dict=False,
    )}


def _plan_latent_numel(adapter, cfg) -> int:
    """Both streams of one sample's latent."""
    import math

    shapes = adapter.latent_shape(cfg.rollout.sampling_options.height, cfg.rollout.sampling_options.width, cfg.rollout.sampling_options.num_frames)
    return sum(math.prod(shape) for shape in shapes.values())


register_plan_spec("MiniMaxH3ModularPipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs,
                                                        latent_numel=_plan_latent_numel))

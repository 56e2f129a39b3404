"""BAGEL's view for the planner (`omni_rl.plan.spec`): its network built from `llm_config.json`
and `vit_config.json` alone, as `BagelAdapter.load` builds it, without the tokenizer or the VAE's
weights that a config-only folder lacks, and one text-to-image forward of it as
`predict_velocity` runs it: each row the prompt padded to `max_sequence_length` (+ its start and
end tokens) and the image being generated, its `<|vision_start|>`/`<|vision_end|>` markers around
(H/16) x (W/16) latent patches. The unconditional rows of CFG are the same width (an empty
context padded to the batch's), so the planner's doubling of the batch is exact. Editing's and
think's extra context (the source image's two blocks, the plan) is not modelled: no real recipe
runs those stages."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from omni_rl.plan.spec import PlanSpec, register_plan_spec

from adapters.bagel.adapter import ARCHITECTURE, DEFAULT_MAX_LATENT_SIZE, DEFAULT_VIT_SIDE
from adapters.bagel.network import LATENT_CHANNELS, LATENT_PATCH, VAE_DOWNSAMPLE, BagelNetwork, LLMConfig


def _plan_load_trained(adapter) -> None:
    folder = Path(adapter.path)
    vit_file = folder / "vit_config.json"
    vit_hidden = json.loads(vit_file.read_text())["hidden_size"] if vit_file.is_file() else None
    adapter.llm_config = LLMConfig.from_json(folder / "llm_config.json")
    with torch.device("meta"):
        network = BagelNetwork(adapter.llm_config, DEFAULT_MAX_LATENT_SIZE, vit_hidden, DEFAULT_VIT_SIDE)
    adapter.network = network.to(adapter.dtype)


def _grid(cfg) -> tuple[int, int]:
    side = VAE_DOWNSAMPLE * LATENT_PATCH
    return cfg.rollout.sampling_options.height // side, cfg.rollout.sampling_options.width // side


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    """The network's keyword arguments for `batch` rows (module docstring)."""
    from omni_rl.plan.spec import prompt_tokens

    h, w = _grid(cfg)
    length = prompt_tokens(cfg) + 2  # <|im_start|> prompt <|im_end|>
    return {"transformer": dict(
        input_ids=torch.zeros(batch, length, dtype=torch.long),
        text_mask=torch.ones(batch, length, dtype=torch.long),
        latent_tokens=torch.zeros(batch, h * w, LATENT_CHANNELS * LATENT_PATCH**2),
        timesteps=torch.ones(batch),
        grid=(h, w),
        marker_ids=(0, 1),
    )}


def _plan_latent_numel(adapter, cfg) -> int:
    """One sample's latent [16, H/8, W/8]."""
    return LATENT_CHANNELS * (cfg.rollout.sampling_options.height // VAE_DOWNSAMPLE) * (cfg.rollout.sampling_options.width // VAE_DOWNSAMPLE)


register_plan_spec(ARCHITECTURE, PlanSpec(_plan_load_trained, _plan_forward_inputs, latent_numel=_plan_latent_numel))

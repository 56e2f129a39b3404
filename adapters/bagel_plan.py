"""BAGEL's view for the planner (`omni_rl.plan.spec`): its network built from `llm_config.json`
and `vit_config.json` alone, as `BagelAdapter.load` builds it, without the tokenizer or the VAE's
weights that a config-only folder lacks. Weights only: no forward is traced yet (the packed
understanding + generation sequence is not modelled)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from adapters.bagel.adapter import ARCHITECTURE, DEFAULT_MAX_LATENT_SIZE, DEFAULT_VIT_SIDE
from adapters.bagel.network import BagelNetwork, LLMConfig
from omni_rl.plan.spec import PlanSpec, register_plan_spec


def _plan_load_trained(adapter) -> None:
    folder = Path(adapter.path)
    vit_file = folder / "vit_config.json"
    vit_hidden = json.loads(vit_file.read_text())["hidden_size"] if vit_file.is_file() else None
    adapter.llm_config = LLMConfig.from_json(folder / "llm_config.json")
    with torch.device("meta"):
        network = BagelNetwork(adapter.llm_config, DEFAULT_MAX_LATENT_SIZE, vit_hidden, DEFAULT_VIT_SIDE)
    adapter.network = network.to(adapter.dtype)


register_plan_spec(ARCHITECTURE, PlanSpec(_plan_load_trained))

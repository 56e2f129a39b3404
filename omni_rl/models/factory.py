"""`build_model(cfg, device)`: find the adapter by name and load the model through it."""
from __future__ import annotations

import torch

from omni_rl.config.schema import ModelConfig
from omni_rl.device import is_weightless
from omni_rl.models.base import OmniModelBase
from omni_rl.models.loading import resolve_model_path
from omni_rl.models.registry import ADAPTERS, adapter_key
from omni_rl.plugins import load_plugins


def build_model(cfg: ModelConfig, device: torch.device, plugins: tuple[str, ...] = ()) -> OmniModelBase:
    load_plugins(plugins)
    adapter_cls = ADAPTERS.get(adapter_key(cfg.adapter, cfg.stage))
    path = resolve_model_path(cfg.path, cfg.revision, weights=not is_weightless(device))
    return adapter_cls(cfg, path, device)

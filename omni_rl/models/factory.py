"""`build_model(cfg, device)`: find the adapter by name and load the model through it.
`options_from_data` gives a model config its adapter's options (and compile options) instances back
after the config crossed a process boundary as plain data."""
from __future__ import annotations

import torch

from omni_rl.config.schema import ModelConfig
from omni_rl.device import is_weightless
from omni_rl.models.base import OmniModelBase
from omni_rl.models.compile import CompileOptions
from omni_rl.models.loading import resolve_model_path
from omni_rl.models.registry import ADAPTERS, adapter_key
from omni_rl.plugins import load_plugins


def options_from_data(cfg: ModelConfig, plugins: tuple[str, ...] = ()) -> ModelConfig:
    """`cfg` with its `adapter_options` the adapter's options instance again where they came as plain data
    (`dataclasses.asdict` of the instance `omni_rl.compose` bound, sent to a vLLM-Omni worker):
    those values were bound and checked where the run was composed, so the instance is rebuilt
    from them as it was, not bound again."""
    load_plugins(plugins)
    options_class = ADAPTERS.get(adapter_key(cfg.adapter, cfg.stage)).options_class
    if not isinstance(cfg.adapter_options, options_class):
        cfg.adapter_options = options_class(**dict(cfg.adapter_options or {}))
    if not isinstance(cfg.compile_options, CompileOptions):
        cfg.compile_options = CompileOptions(**dict(cfg.compile_options or {}))
    return cfg


def build_model(cfg: ModelConfig, device: torch.device, plugins: tuple[str, ...] = ()) -> OmniModelBase:
    load_plugins(plugins)
    adapter_cls = ADAPTERS.get(adapter_key(cfg.adapter, cfg.stage))
    path = resolve_model_path(cfg.path, cfg.revision, weights=not is_weightless(device))
    return adapter_cls(cfg, path, device)

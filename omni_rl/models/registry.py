"""Registries of model adapters and of tiny random-weight model builders.

    @register_adapter("StableDiffusion3Pipeline")          # the architecture a model folder names
    @register_adapter("Qwen3OmniMoeForConditionalGeneration", stage="thinker")
    @register_tiny_model("sd3")                             # build(folder) -> model.path=tiny:sd3
    register_packaged_model("sd3_shapes", folder)           # shipped, checksummed weights

A tiny model is built once into the cache and loaded through the adapter's ordinary loading.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from omni_rl.registry import Registry

ADAPTERS: Registry[type] = Registry("model adapter")
TINY_MODELS: Registry[Callable] = Registry("tiny model")
PACKAGED_MODELS: Registry[Path] = Registry("packaged model")


def adapter_key(architecture: str, stage: str | None = None) -> str:
    """Registry key of an adapter: the architecture, plus `/stage` for models with several
    trainable stages (an omni model's `thinker`)."""
    return f"{architecture}/{stage}" if stage else architecture


def register_adapter(architecture: str, stage: str | None = None):
    return ADAPTERS.register(adapter_key(architecture, stage))


def register_tiny_model(name: str):
    return TINY_MODELS.register(name)


def register_packaged_model(name: str, folder: Path) -> Path:
    return PACKAGED_MODELS.register(name, Path(folder))

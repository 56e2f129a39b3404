"""Registries of model adapters and of tiny random-weight model builders.

`@register_adapter("StableDiffusion3Pipeline")` registers an adapter class under the
architecture name that a diffusers `model_index.json` (`_class_name`) or a transformers
`config.json` (`architectures[0]`) carries, so a model folder can name its own adapter. Models with several stages register one adapter per
stage (`register_adapter("Qwen3OmniMoeForConditionalGeneration", stage="thinker")`), chosen by
`model.stage`.

`@register_tiny_model("sd3")` registers a function `build(folder: Path) -> None` that writes
a tiny random-weight model with `save_pretrained`; `model.path=tiny:sd3` builds it once into
the cache and then loads it through the adapter's ordinary loading code.

`register_packaged_model("sd3_shapes", folder)` names a small trained model shipped inside the
project (a `save_pretrained` folder with a `SHA256SUMS` file): `model.path=tiny:sd3_shapes`
loads it from that folder, after checking every file against its checksum.
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

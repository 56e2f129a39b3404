"""Sizes and frame counts past what a model can take, refused before it loads.

Two kinds of limit, each refused in one line naming the key, the limit and the largest value
that fits:

- a model's position encoding covers a fixed number of positions per axis: SD3's learned
  position embedding (`pos_embed_max_size` patches a side), Wan's rotary table
  (`rope_max_seq_len` positions for frames, rows and columns alike). A size past it fails deep
  in the forward with a bare shape error, or asks for terabytes. `check_model_limits(cfg)`
  reads the model's component configs (`ComponentConfigs`: config.json files only, of a model
  already on disk, `model_folder_on_disk`: no weights, no download, no build) for the
  adapter's `DiffusionModelBase.check_model_limits` (the command line's `check_inputs`);
  `check_positions` is the shared rule; `check_built_model` runs the same through the built
  model's `latent_shape` as the trainer starts, for a model that was not on disk before;
- a sample too large for the machine at all: `check_sample_memory` (from the config alone, in
  `DiffusionModelBase.check_config`) refuses a geometry one decoded sample of which (fp32 RGB,
  H x W x frames) is larger than this machine's memory, before any tensor is allocated.

Not here: the multiples a VAE needs (`omni_rl.models.diffusion.check_multiple`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from omni_rl.errors import OmniConfigError

# Bytes of one decoded sample per pixel and frame: three fp32 channels.
DECODED_BYTES_PER_PIXEL = 3 * 4


def check_positions(key: str, value: int, per_position: int, limit: int, what: str, unit: str = "px",
                    offset: int = 0) -> None:
    """ValueError unless `value` needs at most `limit` positions of `per_position` `unit` each
    (plus `offset`: frames count t*k + 1). `what` names the limit and where it is set."""
    largest = per_position * limit + offset
    if value > largest:
        raise ValueError(
            f"{key}={value}: past {what}, {limit} positions of {per_position} {unit}; the largest valid value is "
            f"{largest}"
        )


def check_sample_memory(height: int, width: int, num_frames: int, memory_bytes: Optional[int] = None) -> None:
    """ValueError when one decoded sample of this geometry is larger than `memory_bytes` (this
    machine's physical memory when None; no check where the OS does not say)."""
    memory_bytes = physical_memory() if memory_bytes is None else memory_bytes
    if memory_bytes is None:
        return
    need = height * width * num_frames * DECODED_BYTES_PER_PIXEL
    if need > memory_bytes:
        raise ValueError(
            f"rollout.height={height} x rollout.width={width} x rollout.num_frames={num_frames}: one sample alone "
            f"is {_size(need)} decoded (fp32 RGB), more than this machine's {_size(memory_bytes)} of memory; use a "
            f"smaller size or fewer frames"
        )


def physical_memory() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class ModelLimitError(OmniConfigError):
    """A rollout geometry the built model cannot take (`check_built_model`)."""


def check_built_model(model, cfg) -> None:
    """The rollout geometry through a built diffusion model's `latent_shape` (its multiples and
    position limits), as one `ModelLimitError` line: for a model that was not on disk when the
    config loaded (a tiny model built on first use), checked before anything is sampled."""
    r = cfg.rollout
    try:
        model.latent_shape(r.height, r.width, r.num_frames)
    except ValueError as err:
        raise ModelLimitError(str(err)) from None


class ComponentConfigs:
    """A model folder's component configs (`transformer/config.json`, ...), read on demand."""

    def __init__(self, folder: Path):
        self.folder = folder

    def get(self, component: str) -> Optional[dict[str, Any]]:
        """The component's config, None when the folder has none (or an unreadable one: the
        model load reports that)."""
        try:
            config = json.loads((self.folder / component / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return config if isinstance(config, dict) else None


def model_folder_on_disk(model_cfg) -> Optional[Path]:
    """The folder holding `model_cfg.path` when it is already on disk (a local folder, a
    packaged or already-built tiny model, a hub snapshot in the cache); None otherwise."""
    from omni_rl.models import loading

    path = model_cfg.path
    try:
        if path.startswith(loading.TINY_PREFIX):
            name = path[len(loading.TINY_PREFIX):]
            folder = loading.packaged_model_folder(name) or loading.tiny_model_folder(name)
            return folder if (folder / ".complete").exists() or (folder / "model_index.json").exists() else None
        expanded = Path(path).expanduser()
        if expanded.is_dir():
            return expanded
        return loading.cached_snapshot(path, model_cfg.revision)
    except Exception:  # noqa: BLE001 (a source the model check names; limits are checked when it loads)
        return None


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"

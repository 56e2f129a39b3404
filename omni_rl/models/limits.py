"""Sizes and frame counts past what a model can take, refused before it loads.

Each refusal names the key, the limit and the largest value that fits: `check_positions` (a
position encoding's size), `check_sample_memory` and `check_step_memory` (samples and a step
larger than this machine). Not here: activations and weights (`--plan`), a VAE's multiples.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omni_rl.device import device_memory
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
            f"rollout.sampling_options.height={height} x rollout.sampling_options.width={width} x rollout.sampling_options.num_frames={num_frames}: one sample alone "
            f"is {_size(need)} decoded (fp32 RGB), more than this machine's {_size(memory_bytes)} of memory; use a "
            f"smaller size or fewer frames"
        )


def decoded_sample_bytes(height: int, width: int, num_frames: int) -> int:
    """A decoded image or video as the rewards get it: uint8 RGB, frames x H x W x 3 bytes."""
    return max(1, num_frames) * height * width * 3


def trajectory_sample_bytes(num_steps: int, latent_numel: int) -> int:
    """One sample's stored trajectory: its latent at each of the `num_steps + 1` points, fp32 (an
    upper bound where an SDE window records fewer steps)."""
    return (num_steps + 1) * latent_numel * 4


@dataclass(frozen=True)
class StepMemory:
    """Bytes a diffusion step holds at once (decoded samples, trajectories), by where they sit."""

    samples: int
    decoded: int  # every sample of the step, uint8 RGB, on the host
    decoding: int  # the samples decoded at once, fp32 RGB, where the rollout model runs
    trajectories: int  # every sample's trajectory, fp32, where the rollout model runs (0: size unknown)


def step_memory(cfg, latent_numel: Optional[int] = None) -> StepMemory:
    """What one step of `cfg` holds; `latent_numel` the elements of one sample's latent (None: unknown)."""
    r, t = cfg.rollout, cfg.trainer
    samples = t.prompts_per_step * t.samples_per_prompt
    at_once = min(r.max_num_seqs, samples)
    per_sample = decoded_sample_bytes(r.sampling_options.height, r.sampling_options.width, r.sampling_options.num_frames)
    trajectories = 0 if latent_numel is None else samples * trajectory_sample_bytes(r.sampling_options.num_steps, latent_numel)
    return StepMemory(samples, samples * per_sample, at_once * per_sample * 4, trajectories)


def check_step_memory(cfg, latent_numel: Optional[int] = None, on_cpu: bool = True,
                      host_bytes: Optional[int] = None, device_bytes: Optional[int] = None) -> None:
    """ValueError, one line naming the geometry key, when a step of `cfg` (`step_memory`) does not
    fit: all of it against `host_bytes` (this machine's memory when None) when the rollout model
    runs `on_cpu`; else the decoded samples against `host_bytes`, and the rest against
    `device_bytes` (the accelerator's memory; None: not checked)."""
    need = step_memory(cfg, latent_numel)
    on_device = need.decoding + need.trajectories
    host_bytes = physical_memory() if host_bytes is None else host_bytes
    checks = ([("this machine's", need.decoded + on_device, host_bytes)] if on_cpu else
              [("this machine's", need.decoded, host_bytes), ("the rollout device's", on_device, device_bytes)])
    for whose, held, limit in checks:
        if limit is not None and held > limit:
            raise ValueError(_step_refusal(cfg, need, whose, held, limit))


def _step_refusal(cfg, need: StepMemory, whose: str, held: int, limit: int) -> str:
    r, t = cfg.rollout, cfg.trainer
    geometry = (f"rollout.sampling_options.num_frames={r.sampling_options.num_frames} (at rollout.sampling_options.height={r.sampling_options.height} x rollout.sampling_options.width={r.sampling_options.width})"
                if r.sampling_options.num_frames > 1 else f"rollout.sampling_options.height={r.sampling_options.height} x rollout.sampling_options.width={r.sampling_options.width}")
    parts = [f"{_size(need.decoded)} decoded (uint8 RGB, all {need.samples}, host)",
             f"{_size(need.decoding)} decoding rollout.max_num_seqs={min(r.max_num_seqs, need.samples)} at once (fp32 RGB)"]
    if need.trajectories:
        parts.append(f"{_size(need.trajectories)} of trajectories (rollout.sampling_options.num_steps={r.sampling_options.num_steps} + 1 latents each, fp32)")
    return (f"{geometry}: a step's {need.samples} samples (trainer.prompts_per_step={t.prompts_per_step} x "
            f"trainer.samples_per_prompt={t.samples_per_prompt}) need {_size(held)} of {whose} {_size(limit)} of "
            f"memory ({'; '.join(parts)}); use fewer frames, a smaller size, fewer samples a step or a smaller "
            f"rollout.max_num_seqs (python main_omni.py ... --plan counts the rest)")


def physical_memory() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class ModelLimitError(OmniConfigError):
    """A rollout geometry the built model cannot take (`check_built_model`)."""


def check_built_model(model, cfg) -> None:
    """The rollout geometry through a built diffusion model's `latent_shape` (its multiples and
    position limits) and the step's memory with its latents (`check_step_memory`), as one
    `ModelLimitError` line: for a model that was not on disk when the
    config loaded (a tiny model built on first use), checked before anything is sampled."""
    r = cfg.rollout.sampling_options
    try:
        shape = model.latent_shape(r.height, r.width, r.num_frames)
        # One stream's shape, or {stream: shape} for a model with several (video and audio).
        shapes = shape.values() if isinstance(shape, dict) else [shape]
        check_step_memory(cfg, sum(math.prod(s) for s in shapes), model.device.type == "cpu",
                          device_bytes=device_memory(model.device))
    except ValueError as err:
        raise ModelLimitError(str(err)) from None


def check_loaded_limits(model, cfg) -> None:
    """`check_model_limits` on a loaded model's own folder, as one `ModelLimitError` line: for a
    model that was not on disk when the config loaded (a tiny model built on first use), checked
    before anything is sampled."""
    try:
        type(model).check_model_limits(cfg, ComponentConfigs(Path(model.path)))
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
            return folder if (folder / ".complete").exists() or loading.pipeline_index(folder) is not None else None
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

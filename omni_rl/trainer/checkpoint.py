"""Full checkpoints: written atomically, found again for `trainer.resume`.

A checkpoint is a folder `OUTPUT/checkpoints/step_000020/` holding

- `trainer_state.pt`: trainable tensors, optimizer state, the step, RNG states (sharded runs:
  the step and RNG states, with the tensors and optimizer in `sharded/`);
- `lora/` (LoRA runs) or `model/` (full fine-tuning): the trained weights in the model
  library's own format (diffusers: `pipe.load_lora_weights(folder)`; PEFT / transformers:
  `from_pretrained`), for use outside omni-rl;
- `config.yaml`: the config of the run that wrote it.

The folder is built under a temporary name and renamed into place only when complete, so a crash
or a bad value mid-save never leaves a checkpoint that looks whole. Older checkpoints beyond
`keep_last` are removed only after the new one is in place.
"""
from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from omni_rl.utils.atomic import atomic_directory, atomic_torch_save

_STEP_DIR = re.compile(r"^step_(\d+)$")
STATE_FILE = "trainer_state.pt"
# Sharded runs (trainer.backend=ray) keep the optimizer and trainable tensors here, one DCP shard per rank.
SHARDED_DIR = "sharded"


class CheckpointError(FileNotFoundError):
    """No usable checkpoint where `trainer.resume` points."""


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(output_dir: Path, step: int, state: dict[str, Any], model, config_yaml: str, keep_last: int) -> Path:
    root = Path(output_dir) / "checkpoints"
    target = root / f"step_{step:06d}"
    with atomic_directory(target) as tmp:
        atomic_torch_save({**state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
        model.save_trained(str(tmp / export_folder(model)))
        (tmp / "config.yaml").write_text(config_yaml)
    prune_checkpoints(output_dir, keep_last)
    return target


def prune_checkpoints(output_dir: Path, keep_last: int) -> None:
    """Remove all but the newest `keep_last` checkpoints (0 keeps all); called only after a new
    checkpoint is in place, so a failed save never costs the previous one."""
    if keep_last > 0:
        for old in list_checkpoints(output_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def export_folder(model) -> str:
    """Where a run's trained weights go: `lora` for LoRA runs, `model` for full fine-tuning."""
    return "lora" if model.cfg.lora.enabled else "model"


def list_checkpoints(output_dir: Path) -> list[Path]:
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def find_checkpoint(path: str) -> Path:
    """`path` is a checkpoint folder, or an output folder whose latest checkpoint is meant."""
    p = Path(path).expanduser()
    if (p / STATE_FILE).is_file():
        return p
    found = list_checkpoints(p)
    if found:
        return found[-1]
    raise CheckpointError(
        f"trainer.resume={path!r}: no checkpoint there (expected a folder with {STATE_FILE}, "
        f"or an output folder with checkpoints/step_NNNNNN/)"
    )


def load_checkpoint(path: str) -> dict[str, Any]:
    folder = find_checkpoint(path)
    state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=False)
    state["folder"] = str(folder)
    return state


def latest_step(output_dir: Path) -> Optional[int]:
    found = list_checkpoints(output_dir)
    return int(_STEP_DIR.match(found[-1].name).group(1)) if found else None

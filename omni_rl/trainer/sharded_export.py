"""`export_sharded_checkpoint`: the trained weights of a sharded checkpoint, in one process.

An offline tool (a composition root of its own, like the command line: it binds the options of
the checkpoint's config): it builds the model on the host from the checkpoint's `config.yaml`, reads the
trainable tensors from `sharded/` (torch.distributed.checkpoint, any number of writer ranks) and
writes the LoRA (PEFT / diffusers format) or full weights, without Ray.
"""
from __future__ import annotations

from pathlib import Path

import torch
import yaml
from omegaconf import OmegaConf

from omni_rl.compose import bind_blocks
from omni_rl.config.loader import upgrade_saved_config
from omni_rl.config.schema import OmniConfig
from omni_rl.models.factory import build_model
from omni_rl.trainer.checkpoint import SHARDED_DIR, find_checkpoint
from omni_rl.utils.atomic import atomic_directory


def export_sharded_checkpoint(checkpoint: str, out_folder: str) -> Path:
    """Write the trained weights of `checkpoint` (a checkpoint or output folder) into `out_folder`."""
    from omni_rl.engine.fsdp2 import load_sharded_trainable

    folder = find_checkpoint(checkpoint)
    if not (folder / SHARDED_DIR).is_dir():
        raise FileNotFoundError(
            f"{folder}: no {SHARDED_DIR}/ folder; this checkpoint was written by trainer.backend=local and "
            f"already holds its export in lora/ or model/"
        )
    # A config written before the sampling knobs moved is read in today's layout.
    saved = upgrade_saved_config(yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8")))
    cfg: OmniConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(OmniConfig), saved))
    bind_blocks(cfg)  # the run's config, checked when it ran: its options blocks bound as then
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    load_sharded_trainable(model, str(folder / SHARDED_DIR))
    with atomic_directory(Path(out_folder)) as tmp:
        model.save_trained(str(tmp))
    return Path(out_folder)

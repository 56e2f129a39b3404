"""`WeightEMA`: the run's exponential moving average of the trained weights, and its options.

The local backend keeps it when `trainer.backend_options.ema_decay` is set, as Flow-GRPO does for
its evaluations: after every `ema_update_interval`-th optimizer step n,
ema <- d_n ema + (1 - d_n) theta, with d_n = min(ema_decay, (1 + n) / (10 + n)) under
`ema_warmup` (Flow-GRPO's ramp), else ema_decay. It is an fp32 copy on the weights' device.
Validation (`val_weights`), the export (`OUTPUT/lora/ema/`) and checkpoints (`ema/NAME`) use it.

Not here: sharded (FSDP2) parameters (a backend that cannot keep it refuses the options at
load), and DiffusionNFT's own EMA of the old policy (`omni_rl.families.forward_process`).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, fields
from typing import Any, Iterator, Optional

import torch

from omni_rl.option import ComponentOptions, option
from omni_rl.families.ema import ParameterEMA

log = logging.getLogger(__name__)

VAL_WEIGHTS = ("trained", "ema", "both")
# What validation with each weights writes: its metric namespace and its folder under OUTPUT
# ("" for the trained weights: OUTPUT/samples/ as before).
VAL_NAMESPACE = {"trained": "val", "ema": "val_ema"}
VAL_FOLDER = {"trained": "", "ema": "ema"}
EXPORT_SUBFOLDER = "ema"


@dataclass
class EMAOptions(ComponentOptions):
    """The one-process backend's options (`trainer.backend_options`): the EMA of the trained weights."""

    ema_decay: Optional[float] = option(None, "Keep an EMA of the trained weights, ema <- d ema + (1 - d) theta "
                                              "after optimizer steps; null or 0: none. Flow-GRPO: 0.9.")
    ema_update_interval: int = option(1, "Update the EMA after every this-many optimizer steps (Flow-GRPO: 8).")
    ema_warmup: bool = option(True, "Flow-GRPO's ramp: the decay of the update after optimizer step n is "
                                    "min(ema_decay, (1 + n) / (10 + n)); false: ema_decay from the first update.")
    val_weights: str = option("trained", "The weights validation samples with: trained, ema (metrics val_ema/*) or "
                                         "both (val/* and val_ema/*).")

    @property
    def keeps_ema(self) -> bool:
        return bool(self.ema_decay)

    def validation_weights(self) -> tuple[str, ...]:
        return ("trained", "ema") if self.val_weights == "both" else (self.val_weights,)

    def check(self) -> None:
        if self.ema_decay is not None and not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay={self.ema_decay!r}: expected in (0, 1), e.g. 0.9, or null / 0 for no EMA")
        if self.ema_update_interval < 1:
            raise ValueError(f"ema_update_interval={self.ema_update_interval!r}: expected an integer >= 1 "
                             f"(optimizer steps between EMA updates)")
        if self.val_weights not in VAL_WEIGHTS:
            raise ValueError(f"val_weights={self.val_weights!r}: expected one of {', '.join(VAL_WEIGHTS)}")
        if self.val_weights != "trained" and not self.keeps_ema:
            raise ValueError(f"val_weights={self.val_weights!r}: no EMA is kept; set trainer.backend_options.ema_decay "
                             f"(e.g. 0.9), or val_weights=trained")


# The keys a backend that keeps no EMA refuses with its own message (not "unknown option").
EMA_OPTION_NAMES = tuple(f.name for f in fields(EMAOptions))


class WeightEMA:
    """The EMA of `model`'s trainable tensors, named like `model.named_trainable_tensors()`."""

    def __init__(self, model, options: EMAOptions):
        if not options.keeps_ema:
            raise ValueError("WeightEMA needs trainer.backend_options.ema_decay in (0, 1)")
        self.options = options
        params = {n: p for n, p in model.trainable_root().named_parameters() if p.requires_grad}
        self.ema = ParameterEMA(params, options.ema_decay)
        self.optimizer_steps = 0  # of the whole run, resumed from checkpoints

    def decay_at(self, n: int) -> float:
        """The decay of the update after optimizer step `n` (1-based)."""
        d = self.options.ema_decay
        return min(d, (1 + n) / (10 + n)) if self.options.ema_warmup else d

    def after_optimizer_step(self) -> None:
        self.optimizer_steps += 1
        if self.optimizer_steps % self.options.ema_update_interval == 0:
            self.ema.update(self.decay_at(self.optimizer_steps))

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The EMA itself (fp32, on the weights' device; not copies)."""
        return self.ema.shadow

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model's trainable parameters hold the EMA inside the block (no gradients)."""
        with torch.no_grad(), self.ema.swapped_in():
            yield

    def meta(self) -> dict[str, Any]:
        """What a checkpoint's `trainer_state.json` records beside the tensors."""
        o = self.options
        return {"decay": o.ema_decay, "update_interval": o.ema_update_interval, "warmup": o.ema_warmup,
                "optimizer_steps": self.optimizer_steps}

    def load(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Resume from a checkpoint's EMA (`ValueError` if its tensors are not this model's)."""
        self.ema.load_state_dict(tensors)
        self.optimizer_steps = int(meta["optimizer_steps"])
        saved = (meta.get("decay"), meta.get("update_interval"), meta.get("warmup"))
        now = (self.options.ema_decay, self.options.ema_update_interval, self.options.ema_warmup)
        if saved != now:
            log.warning("resuming: the EMA continues with this run's ema_decay, ema_update_interval, ema_warmup = %s, "
                        "not the checkpoint's %s", now, saved)

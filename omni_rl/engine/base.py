"""The training-engine interface: the narrow waist between the trainer and the parameters.

An engine owns the parameters and optimizer and knows no algorithm: `forward_backward` runs and
back-propagates `loss_fn(micro_batch)`, `optimizer_step` clips and applies the gradient. A
non-finite loss or gradient norm (read once per mini-batch) drops the update.
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, Callable, Optional

import torch

from omni_rl.errors import OmniRunError
from omni_rl.config.schema import OptimConfig

log = logging.getLogger(__name__)

LossFn = Callable[[Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]
# A metric as an engine returns it: a detached 0-dim tensor on the device (read on the host once
# per update, `omni_rl/families/update.py`), or a plain number.
Metric = "torch.Tensor | float"


def all_finite(flag: Optional[torch.Tensor], value: torch.Tensor) -> torch.Tensor:
    """`flag` and "every element of `value` is finite", as a device bool (no host sync)."""
    ok = torch.isfinite(value.detach()).all()
    return ok if flag is None else flag & ok


def on_host(*flags: torch.Tensor) -> list[bool]:
    """Device bools read on the host together: one sync for all of them."""
    return [bool(v) for v in torch.stack([f.reshape(()).to(torch.bool) for f in flags]).tolist()]


class NonFiniteLossError(OmniRunError, FloatingPointError):
    """A loss or gradient became NaN/inf; the step is refused so the weights stay finite (every
    engine raises it: a run-time error, exit 1)."""


class TrainingEngine(ABC):
    @abstractmethod
    def forward_backward(self, micro_batch: Any, loss_fn: LossFn, loss_scale: float = 1.0) -> dict[str, Metric]:
        """Accumulate the gradient of `loss_scale * loss_fn(micro_batch)[0]`; return its metrics
        (device tensors: no host sync)."""

    @abstractmethod
    def optimizer_step(self) -> dict[str, Metric]:
        """Clip, step, zero the gradients (one host sync: were the losses and the gradient norm
        finite); return `actor/grad_norm` and `actor/lr`."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: trainable tensors and optimizer state."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...


def apply_optim_config(optimizer: torch.optim.Optimizer, cfg: OptimConfig, say: bool = True,
                       lrs: Optional[list[float]] = None) -> list[str]:
    """Set every param group's lr, betas, weight decay and eps to `cfg`'s after a restore (the
    checkpoint's values would win otherwise), keeping moments and step counts; logs and returns the
    values that changed ("optim.lr: 0.001 -> 0.0003"). `lrs`: each group's own lr where the groups
    differ (a prompt writer's and an image model's), else every group takes `cfg.lr`.
    """
    groups = optimizer.param_groups
    lrs = [cfg.lr] * len(groups) if lrs is None else list(lrs)
    if len(lrs) != len(groups):
        raise ValueError(f"the optimizer has {len(groups)} param groups, and {len(lrs)} learning rates were given")
    changes = []
    if len(set(lrs)) > 1:  # each group its own lr
        saved_lrs = [g["lr"] for g in groups]
        if saved_lrs != lrs:
            changes.append(f"optim.lr (per group): {saved_lrs!r} -> {lrs!r}")
        for group, lr in zip(groups, lrs):
            group["lr"] = lr
    wanted = {"lr": lrs[0]} if len(set(lrs)) == 1 else {}
    wanted.update({"betas": tuple(cfg.betas), "weight_decay": cfg.weight_decay, "eps": cfg.eps})
    for key, value in wanted.items():
        saved = sorted({repr(tuple(g[key]) if isinstance(g[key], list) else g[key]) for g in groups})
        if saved != [repr(value)]:
            changes.append(f"optim.{key}: {', '.join(saved)} -> {value!r}")
        for group in groups:
            group[key] = value
    if changes and say:
        log.warning("resuming: the optimizer trains with this run's %s, not the checkpoint's values (its moments and "
                    "step counts are kept)", "; ".join(changes))
    return changes

"""The training-engine interface: the narrow waist between the trainer and the parameters.

An engine owns the trainable parameters and the optimizer. It is handed a loss function and a
micro-batch and knows no algorithm: `forward_backward` runs `loss_fn(micro_batch)`, scales and
back-propagates it; `optimizer_step` clips and applies the accumulated gradient. Sharded engines
(FSDP2) implement the same methods.
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, Callable

import torch

from omni_rl.config.schema import OptimConfig

log = logging.getLogger(__name__)

LossFn = Callable[[Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class TrainingEngine(ABC):
    @abstractmethod
    def forward_backward(self, micro_batch: Any, loss_fn: LossFn, loss_scale: float = 1.0) -> dict[str, float]:
        """Accumulate the gradient of `loss_scale * loss_fn(micro_batch)[0]`; return its metrics."""

    @abstractmethod
    def optimizer_step(self) -> dict[str, float]:
        """Clip, step, zero the gradients; return `actor/grad_norm` and `actor/lr`."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: trainable tensors and optimizer state."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...


def apply_optim_config(optimizer: torch.optim.Optimizer, cfg: OptimConfig, say: bool = True) -> list[str]:
    """Set every param group's lr, betas, weight decay and eps to `cfg`'s, after the optimizer's
    state was restored from a checkpoint (whose param_groups hold the values it was saved with):
    a resumed run trains with the values it is given, its moments and step counts kept. Logs one
    line naming each value that changed (unless not `say`) and returns them
    ("optim.lr: 0.001 -> 0.0003")."""
    wanted = {"lr": cfg.lr, "betas": tuple(cfg.betas), "weight_decay": cfg.weight_decay, "eps": cfg.eps}
    changes = []
    for key, value in wanted.items():
        saved = sorted({repr(tuple(g[key]) if isinstance(g[key], list) else g[key]) for g in optimizer.param_groups})
        if saved != [repr(value)]:
            changes.append(f"optim.{key}: {', '.join(saved)} -> {value!r}")
        for group in optimizer.param_groups:
            group[key] = value
    if changes and say:
        log.warning("resuming: the optimizer trains with this run's %s, not the checkpoint's values (its moments and "
                    "step counts are kept)", "; ".join(changes))
    return changes

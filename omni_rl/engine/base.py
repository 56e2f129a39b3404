"""The training-engine interface: the narrow waist between the trainer and the parameters.

An engine owns the trainable parameters and the optimizer. It is handed a loss function and a
micro-batch and knows no algorithm: `forward_backward` runs `loss_fn(micro_batch)`, scales and
back-propagates it; `optimizer_step` clips and applies the accumulated gradient. Sharded engines
(FSDP2) implement the same methods.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import torch

from omni_rl.errors import OmniRunError

LossFn = Callable[[Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class NonFiniteLossError(OmniRunError, FloatingPointError):
    """A loss or gradient became NaN/inf; the step is refused so the weights stay finite (every
    engine raises it: a run-time error, exit 1)."""


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

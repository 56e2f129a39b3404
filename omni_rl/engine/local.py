"""`LocalEngine`: the one-process training engine (AdamW, gradient accumulation, clipping)."""
from __future__ import annotations

import math
from typing import Any

import torch

from omni_rl.config.schema import OptimConfig
from omni_rl.engine.base import LossFn, TrainingEngine, apply_optim_config
from omni_rl.models.base import OmniModelBase


class NonFiniteLossError(FloatingPointError):
    """A loss or gradient became NaN/inf; the step is refused so the weights stay finite."""


class LocalEngine(TrainingEngine):
    def __init__(self, model: OmniModelBase, cfg: OptimConfig):
        self.model = model
        self.cfg = cfg
        self.params = model.trainable_parameters()
        if not self.params:
            raise ValueError("the model has no trainable parameters; check model.lora or the adapter's trainable_module")
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, eps=cfg.eps
        )
        self.optimizer.zero_grad(set_to_none=True)

    def forward_backward(self, micro_batch: Any, loss_fn: LossFn, loss_scale: float = 1.0) -> dict[str, float]:
        loss, metrics = loss_fn(micro_batch)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(f"the loss is {loss.item()}; refusing to back-propagate it")
        (loss * loss_scale).backward()
        return {k: float(v) for k, v in metrics.items()}

    def optimizer_step(self) -> dict[str, float]:
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        if not math.isfinite(float(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"the gradient norm is {float(grad_norm)}; the update was skipped")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"actor/grad_norm": float(grad_norm), "actor/lr": self.optimizer.param_groups[0]["lr"]}

    def state_dict(self) -> dict[str, Any]:
        return {
            "trainable": {k: v.detach().clone() for k, v in self.model.named_trainable_tensors().items()},
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_named_tensors(state["trainable"])
        self.optimizer.load_state_dict(state["optimizer"])
        apply_optim_config(self.optimizer, self.cfg)  # the config's lr, not the checkpoint's

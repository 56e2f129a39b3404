"""`LocalEngine`: the one-process training engine (AdamW, gradient accumulation, clipping)."""
from __future__ import annotations

from typing import Any, Optional

import torch

from omni_rl.config.schema import OptimConfig
from omni_rl.engine.base import LossFn, Metric, NonFiniteLossError, TrainingEngine, all_finite, apply_optim_config, on_host
from omni_rl.models.base import OmniModelBase


def detached(metrics: dict[str, Any]) -> dict[str, Metric]:
    return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}


def refuse_if_not_finite(optimizer: torch.optim.Optimizer, losses_finite: Optional[torch.Tensor],
                         grad_norm: torch.Tensor, where: str = "") -> None:
    """One host sync: raise `NonFiniteLossError` (gradients dropped, no step) when a loss since the
    last step or the gradient norm is NaN/inf."""
    losses_ok, norm_ok = on_host(losses_finite if losses_finite is not None else torch.ones((), dtype=torch.bool,
                                                                                         device=grad_norm.device),
                                 all_finite(None, grad_norm))
    if losses_ok and norm_ok:
        return
    optimizer.zero_grad(set_to_none=True)
    if not losses_ok:
        raise NonFiniteLossError(f"{where}a loss of this mini-batch is NaN or infinite; the update was skipped "
                                 f"(lower optim.lr, or check the rewards and advantages)")
    raise NonFiniteLossError(f"{where}the gradient norm is {float(grad_norm)}; the update was skipped")


class LocalEngine(TrainingEngine):
    def __init__(self, model: OmniModelBase, cfg: OptimConfig):
        self.model = model
        self.cfg = cfg
        # One AdamW param group per optimizer group of the model (a prompt writer and an image model:
        # two), each with its learning rate; AdamW's moments are per parameter, so groups update
        # as separate optimizers would, and one state dict holds them all.
        self.groups = [g for g in model.optimizer_groups() if g.params]
        self.params = [p for g in self.groups for p in g.params]
        if not self.params:
            raise ValueError("the model has no trainable parameters; check model.lora or the adapter's trainable_module")
        self.lrs = [cfg.lr if g.lr is None else g.lr for g in self.groups]
        self.optimizer = torch.optim.AdamW(
            [{"params": g.params, "lr": lr} for g, lr in zip(self.groups, self.lrs)],
            lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, eps=cfg.eps,
        )
        self.optimizer.zero_grad(set_to_none=True)
        self._losses_finite: Optional[torch.Tensor] = None  # since the last optimizer step (base.py)

    def forward_backward(self, micro_batch: Any, loss_fn: LossFn, loss_scale: float = 1.0) -> dict[str, Metric]:
        loss, metrics = loss_fn(micro_batch)
        self._losses_finite = all_finite(self._losses_finite, loss)
        (loss * loss_scale).backward()
        return detached(metrics)

    def optimizer_step(self) -> dict[str, Metric]:
        # Each group clipped by itself: one model's large gradient does not shrink the other's step.
        norms = [torch.nn.utils.clip_grad_norm_(g.params, self.cfg.max_grad_norm) for g in self.groups]
        grad_norm = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
        refuse_if_not_finite(self.optimizer, self._losses_finite, grad_norm)
        self._losses_finite = None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics = {"actor/grad_norm": grad_norm.detach(), "actor/lr": self.optimizer.param_groups[0]["lr"]}
        if len(self.groups) > 1:
            for g, norm, group in zip(self.groups, norms, self.optimizer.param_groups):
                metrics[f"actor/{g.name}_grad_norm"] = norm.detach()
                metrics[f"actor/{g.name}_lr"] = group["lr"]
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "trainable": {k: v.detach().clone() for k, v in self.model.named_trainable_tensors().items()},
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_named_tensors(state["trainable"])
        self.optimizer.load_state_dict(state["optimizer"])
        apply_optim_config(self.optimizer, self.cfg, lrs=self.lrs)  # the config's lr, not the checkpoint's

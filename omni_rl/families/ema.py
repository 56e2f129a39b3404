"""`ParameterEMA`: an exponential moving average of named trainable parameters, and a swap.

`update(decay)`: ema <- decay ema + (1 - decay) theta, in fp32. Inside `swapped_in()` the
parameters hold the EMA values and get their own storage back on leaving; use it under
`torch.no_grad()`. Not here: when to update, sharded (FSDP2) parameters.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


class ParameterEMA:
    def __init__(self, params: dict[str, nn.Parameter], decay: float):
        if not 0 <= decay < 1:
            raise ValueError(f"EMA decay={decay!r}; expected in [0, 1) (0 copies the weights after every step)")
        if not params:
            raise ValueError("an EMA needs at least one trainable parameter; the model has none")
        self.params = dict(params)
        self.decay = float(decay)
        self.shadow = {n: p.detach().to(torch.float32).clone() for n, p in self.params.items()}
        self._swapped = False

    @torch.no_grad()
    def update(self, decay: float | None = None) -> None:
        """One EMA step towards the parameters' current values, with `decay` (default: the EMA's own)."""
        if self._swapped:
            raise RuntimeError("ParameterEMA.update inside swapped_in(): the parameters hold the EMA itself")
        decay = self.decay if decay is None else float(decay)
        if not 0 <= decay < 1:
            raise ValueError(f"EMA update with decay={decay!r}; expected in [0, 1)")
        for name, p in self.params.items():
            self.shadow[name].mul_(decay).add_(p.detach().to(torch.float32), alpha=1 - decay)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The parameters hold the EMA values inside the block; their own tensors come back after."""
        if self._swapped:
            raise RuntimeError("ParameterEMA.swapped_in() is already active; it does not nest")
        own = {}
        try:
            for name, p in self.params.items():
                own[name] = p.data
                p.data = self.shadow[name].to(dtype=p.dtype)
            self._swapped = True
            yield
        finally:
            for name, data in own.items():
                self.params[name].data = data
            self._swapped = False

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t.detach().cpu().clone() for n, t in self.shadow.items()}

    @torch.no_grad()
    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        missing, extra = sorted(set(self.shadow) - set(tensors)), sorted(set(tensors) - set(self.shadow))
        if missing or extra:
            raise ValueError(
                f"EMA state: {len(missing)} of this model's trainable tensors are missing (e.g. {missing[:1]}) and "
                f"{len(extra)} are not this model's (e.g. {extra[:1]}); resume with the model settings it was saved with"
            )
        for name, value in tensors.items():
            if tuple(value.shape) != tuple(self.shadow[name].shape):
                raise ValueError(
                    f"EMA state: {name!r} has shape {tuple(value.shape)}, this model's {tuple(self.shadow[name].shape)}"
                )
            self.shadow[name].copy_(value.to(self.shadow[name].device, torch.float32))

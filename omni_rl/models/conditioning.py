"""`Conditioning`: the per-sample inputs a model needs besides the latent (prompt embeddings).

A bag of tensors that all share the batch dimension, so the rollout engine can pack samples from
different requests into one forward (`cat`) and the trainer can pick a micro-batch (`select`)
without knowing what a given model's conditioning contains.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class Conditioning:
    tensors: dict[str, torch.Tensor]

    def __post_init__(self) -> None:
        sizes = {name: t.shape[0] for name, t in self.tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"conditioning tensors disagree on the batch size: {sizes}")

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0] if self.tensors else 0

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def select(self, index: Sequence[int] | torch.Tensor) -> "Conditioning":
        idx = torch.as_tensor(index, dtype=torch.long)
        return Conditioning({k: v.index_select(0, idx.to(v.device)) for k, v in self.tensors.items()})

    def to(self, device: torch.device | str) -> "Conditioning":
        return Conditioning({k: v.to(device) for k, v in self.tensors.items()})

    @staticmethod
    def cat(parts: Sequence["Conditioning"]) -> "Conditioning":
        if not parts:
            raise ValueError("Conditioning.cat needs at least one part")
        keys = list(parts[0].tensors)
        for part in parts[1:]:
            if list(part.tensors) != keys:
                raise ValueError(f"cannot concatenate conditionings with keys {keys} and {list(part.tensors)}")
        return Conditioning({k: torch.cat([p.tensors[k] for p in parts]) for k in keys})

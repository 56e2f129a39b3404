"""`Conditioning`: the per-sample inputs a model needs besides the latent (prompt embeddings, masks, media).

A bag of tensors sharing the batch dimension, so the engine can pack requests (`cat`) and the
trainer pick a micro-batch (`select`) without knowing what it holds. `masks` maps a
variable-length embedding `[B, L, ...]` to its mask `[B, L]`; `cat` and `pad_to` pad such pairs
with zeros (mask 0), so a sample's result does not depend on its batch-mates.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass
class Conditioning:
    tensors: dict[str, torch.Tensor]
    masks: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = {name: t.shape[0] for name, t in self.tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"conditioning tensors disagree on the batch size: {sizes}")
        for name, mask in self.masks.items():
            if name not in self.tensors or mask not in self.tensors:
                raise ValueError(f"conditioning mask {mask!r} of {name!r}: both must be tensors of it, have {sorted(self.tensors)}")
            emb, m = self.tensors[name], self.tensors[mask]
            if m.ndim != 2 or emb.ndim < 2 or m.shape != emb.shape[:2]:
                raise ValueError(
                    f"conditioning mask {mask!r} has shape {tuple(m.shape)}: expected [B, L] = {tuple(emb.shape[:2])} of {name!r}"
                )

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0] if self.tensors else 0

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def select(self, index: Sequence[int] | torch.Tensor) -> "Conditioning":
        idx = torch.as_tensor(index, dtype=torch.long)
        return Conditioning({k: v.index_select(0, idx.to(v.device)) for k, v in self.tensors.items()}, dict(self.masks))

    def to(self, device: torch.device | str) -> "Conditioning":
        return Conditioning({k: v.to(device) for k, v in self.tensors.items()}, dict(self.masks))

    def sequence_length(self, name: str) -> int:
        return self.tensors[name].shape[1]

    def pad_to(self, length: int) -> "Conditioning":
        """Every masked sequence padded to `length` (which must be >= its length)."""
        tensors = dict(self.tensors)
        for name, mask in self.masks.items():
            have = tensors[name].shape[1]
            if have > length:
                raise ValueError(f"conditioning {name!r} has length {have}: cannot pad it to {length}")
            if have < length:
                tensors[name] = _pad_dim1(tensors[name], length)
                tensors[mask] = _pad_dim1(tensors[mask], length)
        return Conditioning(tensors, dict(self.masks))

    @staticmethod
    def cat(parts: Sequence["Conditioning"]) -> "Conditioning":
        if not parts:
            raise ValueError("Conditioning.cat needs at least one part")
        keys, masks = list(parts[0].tensors), parts[0].masks
        for part in parts[1:]:
            if list(part.tensors) != keys:
                raise ValueError(f"cannot concatenate conditionings with keys {keys} and {list(part.tensors)}")
            if part.masks != masks:
                raise ValueError(f"cannot concatenate conditionings with masks {masks} and {part.masks}")
        if masks:
            longest = max(p.sequence_length(name) for p in parts for name in masks)
            parts = [p.pad_to(longest) for p in parts]
        return Conditioning({k: torch.cat([p.tensors[k] for p in parts]) for k in keys}, dict(masks))


def _pad_dim1(t: torch.Tensor, length: int) -> torch.Tensor:
    pad = t.new_zeros((t.shape[0], length - t.shape[1], *t.shape[2:]))
    return torch.cat([t, pad], dim=1)

"""LAION aesthetic score (the "improved aesthetic predictor", v2): a small MLP head on CLIP
ViT-L/14 image embeddings, trained to predict human 1..10 aesthetic ratings (used by DDPO).

    score = head(image_embedding(image) / ||image_embedding(image)||)      (roughly 1..10)

The head is five Linear layers (768 -> 1024 -> 128 -> 64 -> 16 -> 1) with dropout and no
activations, as released. Prompts are ignored. Options: `head` (required: the released file,
e.g. `sac+logos+ava1-l14-linearMSE.pth`, keys `layers.0.weight` ... `layers.7.bias`), `model`
(the CLIP it was trained on, `openai/clip-vit-large-patch14`), `processor`, `device`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from omni_rl.reward import Images, check_batch, register_reward
from rewards.clip_embedder import DEFAULT_CLIP, ClipEmbedder
from rewards.pretrained import device_network


class AestheticHead(nn.Module):
    """The LAION aesthetic predictor v2 MLP; parameter names match the released file."""

    def __init__(self, in_features: int = 768):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features).squeeze(-1)


def load_state_dict_file(path: Path, what: str) -> dict[str, torch.Tensor]:
    """A state dict from `.safetensors` (safetensors) or another file (`torch.load(weights_only=True)`)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{what}={str(path)!r}: no such file; expected a local weights file (.pth or .safetensors)"
        )
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{what}={str(path)!r} holds a {type(state).__name__}; expected a state dict (name -> tensor)")
    return state


def _head_given(head: str | None) -> Path:
    if head is None:
        raise ValueError(
            "aesthetic: no head given; pass head=/path/to/sac+logos+ava1-l14-linearMSE.pth (the LAION "
            "aesthetic predictor v2 weights, from github.com/christophschuhmann/improved-aesthetic-predictor)"
        )
    return Path(head).expanduser()


def _check_files(*, head: str | None = None, **_: Any) -> None:
    """When a run starts, before any model loads: the head is given and is a file."""
    if not _head_given(head).is_file():
        raise ValueError(f"aesthetic: head={str(head)!r}: no such file; expected the aesthetic MLP's weights "
                         f"(.pth or .safetensors)")


class AestheticScorer:
    def __init__(self, head: str | None, model: str, processor: str | None, device: str):
        state = load_state_dict_file(_head_given(head), "aesthetic: head")
        if "layers.0.weight" not in state:
            raise ValueError(
                f"aesthetic: head={head!r} has no 'layers.0.weight' (its keys start {sorted(state)[:4]}); "
                f"expected the LAION aesthetic predictor's keys layers.0.weight ... layers.7.bias"
            )
        in_features = state["layers.0.weight"].shape[1]
        self.head = AestheticHead(in_features)
        missing, unexpected = self.head.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"aesthetic: head={head!r} does not match the aesthetic MLP: missing keys {missing[:5]}, "
                f"unexpected keys {unexpected[:5]}; expected exactly layers.{{0,2,4,6,7}}.{{weight,bias}}"
            )
        self.clip = ClipEmbedder("aesthetic", model, processor, device)
        if self.clip.dim != in_features:
            raise ValueError(
                f"aesthetic: the head takes {in_features}-d features but model={model!r} gives "
                f"{self.clip.dim}-d embeddings; use the CLIP the head was trained on "
                f"(ViT-L/14, 768-d, for the released head)"
            )
        self.head.to(self.clip.device).eval()

    @torch.no_grad()
    def __call__(self, images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(images, prompts, metadata)
        return self.head(self.clip.images(images)).cpu().tolist()


def _device_networks(**options: Any) -> list[tuple[str, nn.Module]]:
    """The CLIP and the head (the released head's 768-d input, in float32 as loaded)."""
    networks = device_network("CLIPModel", "model", DEFAULT_CLIP, "aesthetic")(**options)
    with torch.device("meta"):
        networks.append(("aesthetic head", AestheticHead()))
    return networks


@register_reward("aesthetic", check_files=_check_files, device_networks=_device_networks)
def aesthetic(
    *, head: str | None = None, model: str = DEFAULT_CLIP, processor: str | None = None, device: str = "auto",
) -> AestheticScorer:
    """LAION aesthetic predictor v2 score (about 1..10) of each image."""
    return AestheticScorer(head, model, processor, device)

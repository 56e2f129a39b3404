"""BAGEL's SigLIP tower (the understanding side of editing): built from `vit_config.json` with
transformers' `SiglipVisionModel`, loaded strictly from the `vit_model.*` tensors of
`ema.safetensors`, and the official way a source image becomes its input.

- **architecture**: `vit_config.json`'s SigLIP with one layer less than it says (the official
  inference and training build `num_hidden_layers - 1` layers: BAGEL reads the second-to-last
  layer's features, `vit_select_layer=-2`), no pooling head, learned position embeddings (the
  official `rope=False`), and the patch embedding a linear over flattened 14 x 14 x 3 patches in
  place of the convolution (the official `convert_conv2d_to_linear`; the checkpoint holds that
  linear's [D, 588] weight). The linear replaces the conv on this instance only, as the official
  code does; no transformers class is changed;
- **names**: the checkpoint's `vit_model.vision_model.<name>`; transformers 5's
  `SiglipVisionModel` has no `vision_model` level (4.x had it), so `official_name` maps either;
- **input** (`vit_patches`): the official `vit_transform` (`ImageTransform(980, 224, 14)` of
  app.py): the image resized by BAGEL's `MaxLongEdgeMinShortEdgeResize` rule (bicubic, sides
  multiples of 14, the long side at most `14 * vit_max_num_patch_per_side` = 980, the short side
  at least 224, capped at that maximum so that a checkpoint with a small position table - the
  tiny model - still fits), scaled to [-1, 1], cut into patches in `chpwq -> hwpqc` order; the
  patch at (row, col) takes position `row * vit_max_num_patch_per_side + col` (BAGEL's
  "extrapolate" position ids), which indexes both the tower's position embedding and
  `vit_pos_embed`;
- **forward** (`SiglipTower.forward`): patches -> linear + position embedding -> encoder ->
  post layer norm, for a batch of images of one size (full attention within each image, as the
  official varlen flash-attn; sdpa or eager here).

The tower is frozen always and runs once per source image, when the request is admitted.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from omni_rl.models.loading import ModelFolderError

from adapters.bagel.checkpoint import VIT_CONFIG, WEIGHTS, key_mismatch, require_file

PREFIX = "vit_model.vision_model."
# The official vit_transform's short-side minimum and pixel budget (data/transforms.py, app.py).
MIN_SIDE = 224
MAX_PIXELS = 14 * 14 * 9 * 1024


def official_name(name: str) -> str:
    """A tower tensor's name in `ema.safetensors` (module docstring)."""
    return PREFIX + name.removeprefix("vision_model.")


def vit_config(folder: Path):
    """`vit_config.json` as the official code builds the tower from it (module docstring)."""
    from transformers import SiglipVisionConfig

    file = require_file(folder, VIT_CONFIG, "the SigLIP tower's config (BAGEL edits through it)")
    config = SiglipVisionConfig.from_json_file(str(file))
    if config.num_hidden_layers < 2:
        raise ModelFolderError(f"{file}: num_hidden_layers={config.num_hidden_layers}; BAGEL builds the tower one "
                               f"layer short of it, so expected at least 2")
    config.num_hidden_layers -= 1
    config.vision_use_head = False
    return config


class SiglipTower(nn.Module):
    """transformers' `SiglipVisionModel` with the official linear patch embedding."""

    def __init__(self, config):
        from transformers import SiglipVisionModel

        super().__init__()
        self.model = SiglipVisionModel(config)
        c = config
        self.patch_size, self.hidden_size = c.patch_size, c.hidden_size
        self.body.embeddings.patch_embedding = nn.Linear(c.num_channels * c.patch_size**2, c.hidden_size)

    @property
    def body(self) -> nn.Module:
        """The module holding embeddings / encoder / post_layernorm (transformers 4 nests it)."""
        return getattr(self.model, "vision_model", self.model)

    @property
    def max_patches_per_side(self) -> int:
        return self.model.config.image_size // self.patch_size

    def forward(self, patches: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """SigLIP features [B, K, D] of patches [B, K, 3 p p] at flattened positions [B, K]."""
        e = self.body.embeddings
        x = e.patch_embedding(patches.to(e.patch_embedding.weight.dtype)) + e.position_embedding(positions)
        x = self.body.encoder(inputs_embeds=x).last_hidden_state
        return self.body.post_layernorm(x)


def load_tower(folder: Path, dtype: torch.dtype, weights: bool = True) -> SiglipTower:
    """The frozen tower of the folder (module docstring): its `vit_model.*` tensors strictly (a
    missing, unexpected or misshapen one raises `ModelFolderError` naming it), or a meta
    skeleton with `weights=False`."""
    from accelerate import init_empty_weights
    from safetensors import safe_open

    folder = Path(folder)
    config = vit_config(folder)
    with init_empty_weights():
        tower = SiglipTower(config)
    tower.requires_grad_(False)
    if not weights:
        return tower.to(dtype)
    expected = {official_name(k): (k, tuple(v.shape)) for k, v in tower.model.state_dict().items()}
    file = require_file(folder, WEIGHTS, "the network's weights")
    with safe_open(str(file), framework="pt") as f:
        have = {k for k in f.keys() if k.startswith("vit_model.")}
        mismatch = key_mismatch(set(expected) - have, have - set(expected))
        if mismatch:
            raise ModelFolderError(
                f"{file}: {mismatch} SigLIP tensors against the tower {VIT_CONFIG} "
                f"describes ({config.num_hidden_layers} layers: one less than its num_hidden_layers, a linear patch "
                f"embedding, no head); is this BAGEL's ema.safetensors, unconverted and matching its configs?"
            )
        state = {}
        for key, (name, shape) in expected.items():
            got = tuple(f.get_slice(key).get_shape())
            if got != shape:
                raise ModelFolderError(f"{file}: {key} has shape {list(got)}, expected {list(shape)} from {VIT_CONFIG}")
            state[name] = f.get_tensor(key).to(dtype)
    tower.model.load_state_dict(state, strict=True, assign=True)
    tower.requires_grad_(False)
    return tower.eval()


def vit_size(height: int, width: int, patch: int, max_patches_per_side: int) -> tuple[int, int]:
    """(height, width) in px the official vit_transform resizes an image to (module docstring)."""
    max_size = patch * max_patches_per_side
    min_size = min(MIN_SIDE, max_size)

    def divisible(value: float) -> int:
        return max(patch, int(round(value / patch) * patch))

    def scaled(w: int, h: int, scale: float) -> tuple[int, int]:
        return divisible(round(w * scale)), divisible(round(h * scale))

    scale = max(min(max_size / max(width, height), 1.0), min_size / min(width, height))
    w, h = scaled(width, height, scale)
    if w * h > MAX_PIXELS:
        w, h = scaled(w, h, MAX_PIXELS / (w * h))  # the official rule scales the sides by the area ratio
    if max(w, h) > max_size:
        w, h = scaled(w, h, max_size / max(w, h))
    return h, w


def vit_patches(image: torch.Tensor, patch: int, max_patches_per_side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A uint8 [H, W, 3] image -> (patches [K, 3 p p] float32 in [-1, 1], positions [K] long)."""
    from PIL import Image

    h, w = vit_size(image.shape[0], image.shape[1], patch, max_patches_per_side)
    pil = Image.fromarray(image.cpu().numpy()).resize((w, h), Image.BICUBIC)
    x = (torch.from_numpy(np.asarray(pil, dtype=np.float32).copy()) / 255.0 - 0.5) / 0.5  # ToTensor, Normalize(0.5, 0.5)
    rows, cols = h // patch, w // patch
    patches = x.reshape(rows, patch, cols, patch, 3).permute(0, 2, 1, 3, 4).reshape(rows * cols, -1)
    positions = (torch.arange(rows)[:, None] * max_patches_per_side + torch.arange(cols)[None]).reshape(-1)
    return patches, positions


"""The ImageBind network (Girdhar et al. 2023) for the vision, text and audio modalities, with
parameter names that match Meta's `imagebind_huge.pth`.

Each modality runs preprocessor -> trunk -> head -> postprocessor, held in `nn.ModuleDict`s keyed
by modality, which fixes the checkpoint key layout:

    modality_preprocessors.vision.rgbt_stem.proj.1.weight          Conv3d (2, 14, 14) patch stem, no bias
    modality_preprocessors.audio.rgbt_stem.{proj.weight, norm_layer.*}   Conv2d 16x16, stride 10
    modality_preprocessors.{vision, audio}.{cls_token, pos_embedding_helper.pos_embed}
    modality_preprocessors.text.{token_embedding.weight, pos_embed}
    modality_trunks.M.blocks.N.{attn.*, norm_1, norm_2, mlp.fc1, mlp.fc2}   pre-norm, eps 1e-6
    modality_trunks.audio.blocks.N.attn.{bias_k, bias_v}           learned k/v bias tokens
    modality_trunks.vision.pre_transformer_layer.0.{weight, bias}  LayerNorm before the blocks
    modality_heads.{vision, audio}.{0, 2}; text.proj.{0, 1}        LayerNorm, cls / EOT token, Linear
    modality_postprocessors.{text, audio}.1.log_logit_scale        L2-normalise, x exp(scale) / x 20

`ImageBindConfig()` holds `imagebind_huge`'s sizes; every size can be made tiny for tests.
A fresh implementation of the published architecture; the weights are CC-BY-NC-SA 4.0.

Left out: depth, thermal and IMU (their keys are skipped on load), drop-path and dropout, and
interpolating position embeddings (`rewards.imagebind.data` resizes inputs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

MODALITIES = ("vision", "text", "audio")
# Modalities of the released checkpoint that this implementation does not build.
SKIPPED_MODALITIES = ("depth", "thermal", "imu")


@dataclass(frozen=True)
class ImageBindConfig:
    """Sizes of an ImageBind network; the defaults are `imagebind_huge`."""

    out_embed_dim: int = 1024
    # vision: frames are cut into (2, patch, patch) tubelets
    vision_embed_dim: int = 1280
    vision_num_blocks: int = 32
    vision_num_heads: int = 16
    image_size: int = 224
    patch_size: int = 14
    # text: a causal CLIP-style transformer over CLIP BPE ids
    text_embed_dim: int = 1024
    text_num_blocks: int = 24
    text_num_heads: int = 16
    context_length: int = 77
    vocab_size: int = 49408
    # audio: a ViT over [num_mel_bins, target_len] log-mel images of 2 s clips
    audio_embed_dim: int = 768
    audio_num_blocks: int = 12
    audio_num_heads: int = 12
    audio_num_mel_bins: int = 128
    audio_target_len: int = 204
    audio_kernel_size: int = 16
    audio_stride: int = 10

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> "ImageBindConfig":
        """Override the huge sizes with `values`; an unknown key raises listing the known ones."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"imagebind: unknown config key(s) {unknown}; known keys: {sorted(known)}")
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"imagebind: config {key}={value!r}; expected a positive int")
        config = cls(**values)
        for prefix in ("vision", "text", "audio"):
            dim, heads = getattr(config, f"{prefix}_embed_dim"), getattr(config, f"{prefix}_num_heads")
            if dim % heads:
                raise ValueError(f"imagebind: {prefix}_embed_dim={dim} is not divisible by {prefix}_num_heads={heads}")
        if config.image_size % config.patch_size:
            raise ValueError(
                f"imagebind: image_size={config.image_size} is not a multiple of patch_size={config.patch_size}"
            )
        return config

    @property
    def vision_num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2  # 2 frames -> 1 tubelet in time

    @property
    def audio_num_patches(self) -> int:
        def steps(n: int) -> int:
            return (n - self.audio_kernel_size) // self.audio_stride + 1

        return steps(self.audio_num_mel_bins) * steps(self.audio_target_len)


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------

class RepeatToTwoFrames(nn.Module):
    """[N, C, H, W] images -> [N, C, 2, H, W] by repeating in time; 2-frame clips pass through."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 4:
            x = x.unsqueeze(2)
        if x.shape[2] == 1:
            x = x.expand(-1, -1, 2, -1, -1)
        return x


class PatchStem(nn.Module):
    """`proj` (a conv, maybe after a reshaping step) -> tokens [N, patches, D] -> optional LayerNorm.

    A single conv is stored as `proj` itself and several modules as `proj.0`, `proj.1`, ...:
    the checkpoint names the audio conv `rgbt_stem.proj.weight` but the vision one
    `rgbt_stem.proj.1.weight`.
    """

    def __init__(self, proj: list[nn.Module], norm_layer: nn.Module | None = None):
        super().__init__()
        self.proj = proj[0] if len(proj) == 1 else nn.Sequential(*proj)
        self.norm_layer = norm_layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.proj(x).flatten(2).transpose(1, 2)
        return tokens if self.norm_layer is None else self.norm_layer(tokens)


class PositionEmbedding(nn.Module):
    def __init__(self, num_tokens: int, dim: int):
        super().__init__()
        self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, dim))


class PatchPreprocessor(nn.Module):
    """Patch tokens with a cls token in front, plus learned position embeddings."""

    def __init__(self, stem: PatchStem, num_patches: int, dim: int):
        super().__init__()
        self.rgbt_stem = stem
        self.pos_embedding_helper = PositionEmbedding(num_patches + 1, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.rgbt_stem(x)
        tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        return tokens + self.pos_embedding_helper.pos_embed


class TextPreprocessor(nn.Module):
    """Token + position embeddings. The causal mask is made per call rather than kept as the
    released checkpoint's `mask` buffer: it is a constant, and this way the model can be built
    on the meta device and take its weights straight from the checkpoint."""

    def __init__(self, vocab_size: int, context_length: int, dim: int):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, context_length, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.token_embedding(ids) + self.pos_embed

    def causal_mask(self, length: int, device: torch.device) -> torch.Tensor:
        return torch.full((length, length), float("-inf"), device=device).triu(1)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm_1(x)); x + mlp(norm_2(x))."""

    def __init__(self, dim: int, heads: int, bias_kv: bool):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, bias=True, add_bias_kv=bias_kv, batch_first=True)
        self.norm_1 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim)
        self.norm_2 = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm_1(x)
        x = x + self.attn(h, h, h, attn_mask=attn_mask, need_weights=False)[0]
        return x + self.mlp(self.norm_2(x))


class Trunk(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, pre_norm: bool, bias_kv: bool):
        super().__init__()
        self.pre_transformer_layer = nn.Sequential(nn.LayerNorm(dim, eps=1e-6) if pre_norm else nn.Identity())
        self.blocks = nn.ModuleList(Block(dim, heads, bias_kv) for _ in range(depth))

    def forward(self, tokens: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.pre_transformer_layer(tokens)
        for block in self.blocks:
            x = block(x, attn_mask)
        return x


class SelectToken(nn.Module):
    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, self.index]


class TextHead(nn.Module):
    """The EOT token's state (its position is that of the largest id) -> LayerNorm -> Linear."""

    def __init__(self, dim: int, out_dim: int):
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, out_dim, bias=False))

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.proj(x[torch.arange(x.shape[0], device=x.device), ids.argmax(dim=-1)])


class Normalize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(x, dim=-1)


class LogitScale(nn.Module):
    """x * min(exp(log_logit_scale), 100); a parameter when learned, a saved buffer when fixed."""

    def __init__(self, init: float, learnable: bool):
        super().__init__()
        value = torch.tensor(math.log(init))
        if learnable:
            self.log_logit_scale = nn.Parameter(value)
        else:
            self.register_buffer("log_logit_scale", value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_logit_scale.exp().clamp(max=100.0) * x


def _vision_head(dim: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.LayerNorm(dim, eps=1e-6), SelectToken(0), nn.Linear(dim, out_dim, bias=False))


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------

class ImageBindModel(nn.Module):
    """Vision, text and audio towers into one joint embedding space.

    `embed_vision(clips [N, 3, 2, S, S] or images [N, 3, S, S])`, `embed_text(ids [N, 77])` and
    `embed_audio(mels [N, 1, mel_bins, target_len])` return [N, out_embed_dim] embeddings,
    unit-norm (text and audio then times their logit scale, as ImageBind's postprocessors do).
    """

    def __init__(self, config: ImageBindConfig | None = None):
        super().__init__()
        c = self.config = config or ImageBindConfig()
        p = c.patch_size
        vision_stem = PatchStem([
            RepeatToTwoFrames(),
            nn.Conv3d(3, c.vision_embed_dim, kernel_size=(2, p, p), stride=(2, p, p), bias=False),
        ])
        audio_stem = PatchStem(
            [nn.Conv2d(1, c.audio_embed_dim, kernel_size=c.audio_kernel_size, stride=c.audio_stride, bias=False)],
            norm_layer=nn.LayerNorm(c.audio_embed_dim),
        )
        self.modality_preprocessors = nn.ModuleDict({
            "vision": PatchPreprocessor(vision_stem, c.vision_num_patches, c.vision_embed_dim),
            "text": TextPreprocessor(c.vocab_size, c.context_length, c.text_embed_dim),
            "audio": PatchPreprocessor(audio_stem, c.audio_num_patches, c.audio_embed_dim),
        })
        self.modality_trunks = nn.ModuleDict({
            "vision": Trunk(c.vision_embed_dim, c.vision_num_blocks, c.vision_num_heads, pre_norm=True, bias_kv=False),
            "text": Trunk(c.text_embed_dim, c.text_num_blocks, c.text_num_heads, pre_norm=False, bias_kv=False),
            "audio": Trunk(c.audio_embed_dim, c.audio_num_blocks, c.audio_num_heads, pre_norm=False, bias_kv=True),
        })
        self.modality_heads = nn.ModuleDict({
            "vision": _vision_head(c.vision_embed_dim, c.out_embed_dim),
            "text": TextHead(c.text_embed_dim, c.out_embed_dim),
            "audio": _vision_head(c.audio_embed_dim, c.out_embed_dim),
        })
        self.modality_postprocessors = nn.ModuleDict({
            "vision": Normalize(),
            "text": nn.Sequential(Normalize(), LogitScale(1 / 0.07, learnable=True)),
            "audio": nn.Sequential(Normalize(), LogitScale(20.0, learnable=False)),
        })

    def _run(self, modality: str, x: torch.Tensor) -> torch.Tensor:
        tokens = self.modality_preprocessors[modality](x)
        tokens = self.modality_trunks[modality](tokens)
        return self.modality_postprocessors[modality](self.modality_heads[modality](tokens))

    def embed_vision(self, clips: torch.Tensor) -> torch.Tensor:
        return self._run("vision", clips)

    def embed_audio(self, mels: torch.Tensor) -> torch.Tensor:
        return self._run("audio", mels)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        pre = self.modality_preprocessors["text"]
        tokens = self.modality_trunks["text"](pre(ids), attn_mask=pre.causal_mask(ids.shape[1], ids.device))
        return self.modality_postprocessors["text"](self.modality_heads["text"](tokens, ids))


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from a `.safetensors` file or a `torch.save`d one (`.pth`, read with
    `weights_only=True`); a `{"model": ...}` or `{"state_dict": ...}` wrapper is unwrapped."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"imagebind: checkpoint={str(path)!r}: no such file; expected a local state dict (.pth or "
            f".safetensors), e.g. Meta's imagebind_huge.pth (CC-BY-NC-SA 4.0, non-commercial)"
        )
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    for wrapper in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict):
        raise ValueError(f"imagebind: checkpoint={str(path)!r} holds a {type(state).__name__}; expected a state dict")
    return state


def load_checkpoint(model: ImageBindModel, state: Mapping[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Load `state` into `model` with strict key matching.

    Skipped, on purpose: keys of the depth/thermal/IMU modalities (not built here) and
    `modality_preprocessors.text.mask` (the causal mask, a constant this module derives).
    Anything else missing or unexpected raises, listing a few of each; a shape mismatch
    raises naming the key, which usually means `config` does not describe this checkpoint.
    """
    def skipped(key: str) -> bool:
        parts = key.split(".")
        return key == "modality_preprocessors.text.mask" or (len(parts) > 1 and parts[1] in SKIPPED_MODALITIES)

    kept = {k: v for k, v in state.items() if not skipped(k)}
    expected = model.state_dict()
    missing = sorted(set(expected) - set(kept))
    unexpected = sorted(set(kept) - set(expected))
    if missing or unexpected:
        def show(keys: list[str]) -> str:
            return ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "") if keys else "none"

        raise ValueError(
            f"imagebind: {source} does not match the ImageBind architecture: {len(missing)} missing key(s): "
            f"{show(missing)}; {len(unexpected)} unexpected key(s): {show(unexpected)}. Expected Meta's "
            f"imagebind_huge.pth key layout (see rewards/imagebind/model.py)"
        )
    for key, value in kept.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ValueError(
                f"imagebind: {source} has {key} of shape {tuple(value.shape)} but the configured model expects "
                f"{tuple(expected[key].shape)}; pass the config (sizes) the checkpoint was trained with "
                f"(no config = imagebind_huge)"
            )
    # assign=True: the tensors are taken over rather than copied, so a model built on the meta
    # device (see `build_model`) never allocates random weights first. fp32 throughout.
    kept = {k: v.float() if v.is_floating_point() else v for k, v in kept.items()}
    model.load_state_dict(kept, strict=True, assign=True)


def build_model(
    config: ImageBindConfig, state: Mapping[str, torch.Tensor], source: str = "checkpoint",
) -> ImageBindModel:
    """An `ImageBindModel(config)` holding the weights of `state` (strictly matched), in eval mode."""
    with torch.device("meta"):
        model = ImageBindModel(config)
    load_checkpoint(model, state, source)
    return model.eval()

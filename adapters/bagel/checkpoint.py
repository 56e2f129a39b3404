"""BAGEL's checkpoint layout: reading it strictly, writing it back, and its FLUX VAE.

A BAGEL folder (ByteDance-Seed/BAGEL-7B-MoT) holds `ema.safetensors` (every network tensor under
the official names), `ae.safetensors` (FLUX.1's VAE in Black Forest Labs' layout),
`llm_config.json` (a Qwen2 config), `vit_config.json` (SigLIP; present when the model
understands images), `config.json` and the Qwen2 tokenizer files.

- `read_network(network, folder, dtype)`: every tensor of `network.state_dict()` must be in
  `ema.safetensors` with its shape, and the file may hold nothing else except the SigLIP
  tower's `vit_model.*` tensors when `vit_config.json` is there: the tower is not a module of
  the network (text-to-image never builds it; editing loads it strictly on its own, frozen,
  adapters/bagel/vision.py), and `write_network` copies those tensors through unchanged. A
  missing file, a missing or unexpected key or a wrong shape raises `ModelFolderError` naming it
  (`key_mismatch` words the keys).
- `write_network(state, source, folder)`: an `ema.safetensors` in the official layout (the given
  tensors, plus the source's `vit_model.*`), and the source's other files copied, so the folder
  loads like the original (by this adapter and by the official code).
- `load_vae(folder, dtype, weights)`: diffusers' `AutoencoderKL` with FLUX.1's configuration
  (`FLUX_VAE_CONFIG`: 16 channels, 8 px, BAGEL's scale 0.3611 and shift 0.1159), its weights
  converted from the BFL layout by diffusers' own `convert_ldm_vae_checkpoint`. A folder may
  carry `vae_config.json` (an AutoencoderKL config) for another geometry: the tiny model does.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from omni_rl.models.loading import ModelFolderError

WEIGHTS = "ema.safetensors"
VAE_WEIGHTS = "ae.safetensors"
LLM_CONFIG = "llm_config.json"
VIT_CONFIG = "vit_config.json"
VAE_CONFIG = "vae_config.json"
# The SigLIP tower's tensors: not the network's, and never trained (module docstring).
PASSTHROUGH_PREFIX = "vit_model."

# FLUX.1's autoencoder as diffusers configures it (black-forest-labs/FLUX.1-dev, vae/config.json),
# with BAGEL's latent scale and shift (modeling/autoencoder.py's `load_ae`).
FLUX_VAE_CONFIG = dict(
    in_channels=3, out_channels=3, latent_channels=16, layers_per_block=2, norm_num_groups=32,
    block_out_channels=[128, 256, 512, 512],
    down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
    act_fn="silu", sample_size=1024, use_quant_conv=False, use_post_quant_conv=False,
    scaling_factor=0.3611, shift_factor=0.1159,
)


def require_file(folder: Path, name: str, what: str) -> Path:
    file = Path(folder) / name
    if not file.is_file():
        raise ModelFolderError(
            f"{file} is missing: a BAGEL checkpoint keeps {what} there (ByteDance-Seed/BAGEL-7B-MoT's layout); "
            f"fetch the whole repository"
        )
    return file


def key_mismatch(missing: set[str], unexpected: set[str]) -> str:
    """"2 missing (e.g. [...]) and 1 unexpected (e.g. [...])" for a strict load's error, "" when none."""
    parts = [f"{len(names)} {what} (e.g. {sorted(names)[:3]})" for what, names in (("missing", missing),
                                                                                  ("unexpected", unexpected)) if names]
    return " and ".join(parts)


def read_network(network: torch.nn.Module, folder: Path, dtype: torch.dtype) -> None:
    """Load `ema.safetensors` into `network` strictly (module docstring)."""
    from safetensors import safe_open

    file = require_file(folder, WEIGHTS, "the network's weights")
    expected = {k: tuple(v.shape) for k, v in network.state_dict().items()}
    allow_passthrough = (Path(folder) / VIT_CONFIG).is_file()
    with safe_open(str(file), framework="pt") as f:
        keys = set(f.keys())
        unexpected = {k for k in keys - set(expected) if not (allow_passthrough and k.startswith(PASSTHROUGH_PREFIX))}
        mismatch = key_mismatch(set(expected) - keys, unexpected)
        if mismatch:
            raise ModelFolderError(
                f"{file}: {mismatch} keys against BAGEL's official names "
                f"(llm_config.json's {network.config.num_hidden_layers} layers); is this BAGEL's ema.safetensors, "
                f"unconverted and matching its configs?"
            )
        for key, shape in expected.items():
            have = tuple(f.get_slice(key).get_shape())
            if have != shape:
                raise ModelFolderError(
                    f"{file}: {key} has shape {list(have)}, expected {list(shape)} from {LLM_CONFIG}"
                    f"{' / ' + VIT_CONFIG if key.startswith(('connector.', 'vit_pos_embed.')) else ''}; "
                    f"the weights and the configs are from different checkpoints"
                )
        state = {k: f.get_tensor(k).to(dtype) for k in expected}
    # The fixed sin-cos tables stay fp32 as the official code keeps them.
    for key in ("latent_pos_embed.pos_embed", "vit_pos_embed.pos_embed"):
        if key in state:
            state[key] = state[key].float()
    # `network` may be a meta-device skeleton: assign the tensors instead of copying into it.
    network.load_state_dict(state, strict=True, assign=True)
    for module in network.modules():
        if hasattr(module, "pos_embed"):
            module.pos_embed.requires_grad_(False)


def passthrough_keys(folder: Path) -> list[str]:
    from safetensors import safe_open

    file = Path(folder) / WEIGHTS
    if not file.is_file():
        return []
    with safe_open(str(file), framework="pt") as f:
        return [k for k in f.keys() if k.startswith(PASSTHROUGH_PREFIX)]


def write_network(state: dict[str, torch.Tensor], source: Path, folder: Path) -> None:
    """`folder/ema.safetensors` = `state` + the source's `vit_model.*` tensors, and every other
    file of the source folder copied (hard-linked where possible), so `folder` is a checkpoint."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    source, folder = Path(source), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    src = source / WEIGHTS
    if src.is_file():
        with safe_open(str(src), framework="pt") as f:
            for key in f.keys():
                if key.startswith(PASSTHROUGH_PREFIX):
                    tensors[key] = f.get_tensor(key)
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
    for item in source.iterdir():
        if item.name == WEIGHTS or item.name.startswith(".") or not item.is_file():
            continue
        target = folder / item.name
        if target.exists():
            continue
        try:
            os.link(item, target)
        except OSError:
            shutil.copy2(item, target)


def vae_config(folder: Path) -> dict:
    file = Path(folder) / VAE_CONFIG
    if file.is_file():
        config = json.loads(file.read_text())
        return {k: v for k, v in config.items() if not k.startswith("_")}
    return dict(FLUX_VAE_CONFIG)


def load_vae(folder: Path, dtype: torch.dtype, weights: bool = True):
    """The VAE (module docstring): weights from `ae.safetensors`, strictly, or a meta skeleton."""
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
    from safetensors.torch import load_file

    from omni_rl.device import weightless_device

    config = vae_config(folder)
    if not weights:
        with weightless_device():
            vae = AutoencoderKL.from_config(config)
        return vae if dtype == torch.float32 else vae.to(dtype)
    file = require_file(folder, VAE_WEIGHTS, "FLUX's VAE")
    vae = AutoencoderKL.from_config(config)
    converted = convert_ldm_vae_checkpoint(load_file(str(file)), config)
    missing, unexpected = set(vae.state_dict()) - set(converted), set(converted) - set(vae.state_dict())
    if missing or unexpected:
        raise ModelFolderError(
            f"{file}: not FLUX's VAE in the BFL layout ({len(missing)} missing, e.g. {sorted(missing)[:2]}; "
            f"{len(unexpected)} unexpected, e.g. {sorted(unexpected)[:2]})"
        )
    for key, value in converted.items():
        if tuple(value.shape) != tuple(vae.state_dict()[key].shape):
            raise ModelFolderError(f"{file}: {key} has shape {list(value.shape)}, expected {list(vae.state_dict()[key].shape)}")
    vae.load_state_dict(converted, strict=True)
    return vae if dtype == torch.float32 else vae.to(dtype)


def vae_to_bfl(state: dict[str, torch.Tensor], num_up_blocks: int) -> dict[str, torch.Tensor]:
    """diffusers' AutoencoderKL state dict -> the BFL / LDM layout of `ae.safetensors` (the
    inverse of diffusers' converter; the tiny builder checks the round trip)."""
    out = {}
    for key, value in state.items():
        k = key
        for side in ("encoder", "decoder"):
            for i in (0, 1):
                k = k.replace(f"{side}.mid_block.resnets.{i}.", f"{side}.mid.block_{i + 1}.")
        if k.startswith("decoder.up_blocks."):
            index, tail = k[len("decoder.up_blocks."):].split(".", 1)
            k = f"decoder.up.{num_up_blocks - 1 - int(index)}.{tail}"
        for a, b in (("down_blocks.", "down."), ("resnets.", "block."), ("downsamplers.0.", "downsample."),
                     ("upsamplers.0.", "upsample."), ("conv_shortcut", "nin_shortcut"), ("conv_norm_out", "norm_out"),
                     ("mid_block.attentions.0.", "mid.attn_1."), ("group_norm.", "norm."), ("to_q.", "q."),
                     ("to_k.", "k."), ("to_v.", "v."), ("to_out.0.", "proj_out.")):
            k = k.replace(a, b)
        if ".attn_1." in k and value.ndim == 2:
            value = value[:, :, None, None]  # the LDM layout's 1x1 convolutions
        out[k] = value
    return out

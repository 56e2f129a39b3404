"""`tiny:bagel`: a seeded random-weight BAGEL written in the official layout.

The folder holds what ByteDance-Seed/BAGEL-7B-MoT holds, at tiny sizes, and loads through the
adapter's ordinary code: `ema.safetensors` under the official names (a 2-layer MoT decoder,
hidden 32, 4 heads of 8 with 2 KV heads; a 64-token latent grid side of 8, so up to 128 px; the
connector and `vit_pos_embed` of a 16-wide SigLIP, plus a 1-layer SigLIP tower's `vit_model.*`
tensors), `ae.safetensors` (a 4-level 16-channel VAE in the BFL layout, 8 px per latent),
`llm_config.json`, `vit_config.json`, `config.json`, `vae_config.json` (the tiny VAE's geometry,
which FLUX's real one does not need) and a byte-level Qwen2 tokenizer with BAGEL's special tokens.

Two departures from the official initialisation, so that a tiny model can learn:

- `llm2vae` keeps PyTorch's default init: the official init zeroes it, and a fresh model would
  predict v = 0 everywhere;
- the VAE decoder is deterministic and responds to the latent (`make_kl_decoder_responsive`):
  every residual branch and the attention output are zero (each block is its shortcut), the
  upsamplers copy their channels, `conv_in` writes u = the channel mean of BAGEL's latent
  (`scale (z - shift)`) into feature 0 and a constant 4 into feature 1, and `conv_out` sets every
  pixel to `gain * silu(feature 0)` after the one-group norm, offset so that latent 0 decodes to
  mid-grey. Brightness then rises monotonically with the mean latent (8x8 pixel blocks of one
  value); tests/adapters/test_bagel_adapter.py measures it.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from omni_rl.models import register_tiny_model
from omni_rl.models.tiny_vocab import bpe_files, byte_chars

from adapters.bagel.adapter import ARCHITECTURE, BOS, EOS, IMAGE_END, IMAGE_START
from adapters.bagel.checkpoint import VAE_CONFIG, vae_to_bfl
from adapters.bagel.network import BagelNetwork, LLMConfig
from adapters.tiny_decoders import pass_through

TINY_LLM = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6)
TINY_MAX_LATENT = 8
TINY_VIT = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=14,
                image_size=28, num_channels=3, model_type="siglip_vision_model")
TINY_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=16, layers_per_block=1, norm_num_groups=1,
    block_out_channels=[16, 16, 16, 16], down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4, use_quant_conv=False, use_post_quant_conv=False,
    scaling_factor=0.3611, shift_factor=0.1159, sample_size=32,
)


def tiny_tokenizer():
    """A byte-level Qwen2 tokenizer (every byte a token, no merges) with BAGEL's special tokens."""
    from transformers import Qwen2Tokenizer

    chars = byte_chars()
    with bpe_files({chars[b]: b for b in range(256)}) as (vocab, merges):
        tokenizer = Qwen2Tokenizer(str(vocab), str(merges), unk_token=None, bos_token=None, eos_token=EOS,
                                   pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": [BOS, EOS, IMAGE_START, IMAGE_END]})
    return tokenizer


@torch.no_grad()
def make_kl_decoder_responsive(vae, gain: float = 1.0, constant: float = 4.0) -> None:
    """Set an `AutoencoderKL` decoder to the construction in the module docstring."""
    from diffusers.models.attention_processor import Attention
    from diffusers.models.resnet import ResnetBlock2D
    from diffusers.models.upsampling import Upsample2D

    decoder = vae.decoder
    for module in decoder.modules():
        if isinstance(module, ResnetBlock2D):
            module.conv2.weight.zero_()
            module.conv2.bias.zero_()
        elif isinstance(module, Attention):
            module.to_out[0].weight.zero_()
            module.to_out[0].bias.zero_()
        elif isinstance(module, Upsample2D):
            pass_through(module.conv)
    config = vae.config
    channels = config.latent_channels
    conv_in = decoder.conv_in
    conv_in.weight.zero_()
    conv_in.bias.zero_()
    # The decoder reads z = latent / scale + shift: feature 0 = mean_c (z - shift) scale.
    conv_in.weight[0, :, 1, 1] = config.scaling_factor / channels
    conv_in.bias[0] = -config.shift_factor * config.scaling_factor
    conv_in.bias[1] = constant
    conv_out = decoder.conv_out
    conv_out.weight.zero_()
    conv_out.bias.zero_()
    conv_out.weight[:, 0, 1, 1] = gain
    # Latent 0 -> pixel 0 (mid-grey).
    zero = torch.full((1, channels, 4, 4), config.shift_factor)
    conv_out.bias.sub_(vae.decode(zero).sample.mean())


@register_tiny_model("bagel")
def build_tiny_bagel(folder: Path) -> None:
    """Write `tiny:bagel` (module docstring) into `folder`."""
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
    from safetensors.torch import save_file
    from transformers import SiglipVisionConfig, SiglipVisionModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(folder)
    llm = dict(TINY_LLM, vocab_size=len(tokenizer), model_type="qwen2", architectures=["Qwen2ForCausalLM"],
               max_position_embeddings=1024, tie_word_embeddings=False, qk_norm=True, layer_module="Qwen2MoTDecoderLayer",
               rope_scaling=None)
    (folder / "llm_config.json").write_text(json.dumps(llm, indent=2))
    (folder / "vit_config.json").write_text(json.dumps(TINY_VIT, indent=2))
    (folder / "config.json").write_text(json.dumps(
        {"architectures": [ARCHITECTURE], "visual_gen": True, "visual_und": True, "latent_patch_size": 2,
         "max_latent_size": TINY_MAX_LATENT, "vit_max_num_patch_per_side": 4}, indent=2))

    network = BagelNetwork(LLMConfig(**{k: llm[k] for k in LLMConfig.__dataclass_fields__}), TINY_MAX_LATENT,
                           TINY_VIT["hidden_size"], vit_max_patches_per_side=4)
    with torch.no_grad():
        network.language_model.model.embed_tokens.weight.normal_(0, 1)
    tensors = {k: v.contiguous() for k, v in network.state_dict().items()}
    vit = SiglipVisionModel(SiglipVisionConfig(**{k: v for k, v in TINY_VIT.items() if k != "model_type"}))
    tensors.update({f"vit_model.{k}": v.contiguous() for k, v in vit.state_dict().items()})
    save_file(tensors, str(folder / "ema.safetensors"), metadata={"format": "pt"})

    vae = AutoencoderKL(**TINY_VAE)
    make_kl_decoder_responsive(vae)
    diffusers_state = vae.state_dict()
    bfl = vae_to_bfl(diffusers_state, len(TINY_VAE["up_block_types"]))
    back = convert_ldm_vae_checkpoint(bfl, TINY_VAE)
    if set(back) != set(diffusers_state) or any(not torch.equal(back[k], diffusers_state[k]) for k in back):
        raise RuntimeError("tiny:bagel: the BFL layout of the tiny VAE does not convert back through diffusers")
    save_file({k: v.contiguous() for k, v in bfl.items()}, str(folder / "ae.safetensors"))
    (folder / VAE_CONFIG).write_text(json.dumps(TINY_VAE, indent=2))

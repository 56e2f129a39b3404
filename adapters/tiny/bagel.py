"""`tiny:bagel` and `tiny:bagel_edit`: seeded random-weight BAGELs written in the official layout.

The folder holds what ByteDance-Seed/BAGEL-7B-MoT holds, at tiny sizes, and loads through the
adapters' ordinary code: `ema.safetensors` under the official names (a 2-layer MoT decoder,
hidden 32, 4 heads of 8 with 2 KV heads; a 64-token latent grid side of 8, so up to 128 px; the
connector and `vit_pos_embed` of a 16-wide SigLIP with 4 x 4 patch positions, and that tower's
`vit_model.vision_model.*` tensors as the official code saves them: the linear patch embedding,
no head, one layer of `vit_config.json`'s two; adapters/bagel/vision.py), `ae.safetensors` (a
4-level 16-channel VAE in the BFL layout, 8 px per latent), `llm_config.json`,
`vit_config.json`, `config.json`, `vae_config.json` (the tiny VAE's geometry, which FLUX's real
one does not need) and a byte-level Qwen2 tokenizer with BAGEL's special tokens. Both models have
the same network and tower; `tiny:bagel_edit` differs in its VAE encoder only.

Departures from the official initialisation, so that a tiny model can learn:

- `llm2vae` keeps PyTorch's default init: the official init zeroes it, and a fresh model would
  predict v = 0 everywhere;
- the VAE decoder is deterministic and responds to the latent (`make_kl_decoder_responsive`):
  every residual branch and the attention output are zero (each block is its shortcut), the
  upsamplers copy their channels, `conv_in` writes u = the channel mean of BAGEL's latent
  (`scale (z - shift)`) into feature 0 and a constant 4 into feature 1, and `conv_out` sets every
  pixel to `gain * silu(feature 0)` after the one-group norm, offset so that latent 0 decodes to
  mid-grey. Brightness then rises monotonically with the mean latent above about -1 (8x8 pixel
  blocks of one value); tests/adapters/test_bagel_adapter.py measures it;
- `tiny:bagel_edit` only: the VAE encoder is its mirror (`make_kl_encoder_responsive`), so an
  edit's source image reaches the model as latents that carry its brightness: residual branches
  and attention zero, each downsampler the mean of 2 x 2 positions, `conv_in` writes the pixels'
  channel mean (plus an offset) into feature 0 and a constant into feature 1, and `conv_out` maps
  feature 0 after the one-group norm and SiLU affinely onto every latent channel, black -> -1 and
  white -> +1 in BAGEL's space (nearly affine between), with a log-variance of -30.
  tests/adapters/test_bagel_edit_adapter.py measures it.
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
from adapters.bagel.vision import SiglipTower, official_name, vit_config
from adapters.tiny.decoders import pass_through

TINY_LLM = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6)
TINY_MAX_LATENT = 8
TINY_VIT_SIDE = 4  # patches a side: 56 px at 14 px a patch
# vit_config.json: 2 layers, of which BAGEL builds 1 (adapters/bagel/vision.py).
TINY_VIT = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=14,
                image_size=14 * TINY_VIT_SIDE, num_channels=3, model_type="siglip_vision_model")
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
def shortcut_only(root) -> None:
    """Zero every residual branch (ResnetBlock2D's `conv2`) and attention output under `root`, so
    each of those blocks passes its input through."""
    from diffusers.models.attention_processor import Attention
    from diffusers.models.resnet import ResnetBlock2D

    for module in root.modules():
        if isinstance(module, ResnetBlock2D):
            module.conv2.weight.zero_()
            module.conv2.bias.zero_()
        elif isinstance(module, Attention):
            module.to_out[0].weight.zero_()
            module.to_out[0].bias.zero_()


@torch.no_grad()
def make_kl_decoder_responsive(vae, gain: float = 1.0, constant: float = 4.0) -> None:
    """Set an `AutoencoderKL` decoder to the construction in the module docstring."""
    from diffusers.models.upsampling import Upsample2D

    decoder = vae.decoder
    shortcut_only(decoder)
    for module in decoder.modules():
        if isinstance(module, Upsample2D):
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


@torch.no_grad()
def make_kl_encoder_responsive(vae, constant: float = 8.0, offset: float = 2.0) -> None:
    """Set an `AutoencoderKL` encoder to the construction in the module docstring: BAGEL's latent
    (`scale (z - shift)`) of every 8x8 pixel block rises with the block's mean grey, from -1 for
    black to +1 for white, in every channel."""
    from diffusers.models.downsampling import Downsample2D

    encoder = vae.encoder
    shortcut_only(encoder)
    for module in encoder.modules():
        if isinstance(module, Downsample2D):
            # Padded right / bottom by one, stride 2: taps (0..1, 0..1) average one 2x2 block.
            conv = module.conv
            conv.weight.zero_()
            conv.bias.zero_()
            for c in range(conv.weight.shape[0]):
                conv.weight[c, c, :2, :2] = 0.25
    conv_in = encoder.conv_in
    conv_in.weight.zero_()
    conv_in.bias.zero_()
    conv_in.weight[0, :, 1, 1] = 1.0 / conv_in.weight.shape[1]
    # The offset keeps feature 0 positive and the constant dominates the one-group norm's
    # spread, so after the norm and the SiLU feature 0 is nearly affine in the grey.
    conv_in.bias[0] = offset
    conv_in.bias[1] = constant
    channels = vae.config.latent_channels
    conv_out = encoder.conv_out
    conv_out.weight.zero_()
    conv_out.bias.zero_()
    conv_out.weight[:channels, 0, 1, 1] = 1.0  # for now: the latent is the normed feature itself
    conv_out.bias[channels:] = -30.0  # log-variance: a point mass, the mean is the sample
    # Fit the affine map: black (-1) -> latent -1, white (+1) -> +1, in BAGEL's space.
    black, white = (float(vae.encode(torch.full((1, 3, 8, 8), g)).latent_dist.mean.mean()) for g in (-1.0, 1.0))
    config = vae.config
    gain = 2.0 / config.scaling_factor / (white - black)
    conv_out.weight[:channels, 0, 1, 1] = gain
    conv_out.bias[:channels] = config.shift_factor - 1.0 / config.scaling_factor - gain * black


@register_tiny_model("bagel")
def build_tiny_bagel(folder: Path) -> None:
    """Write `tiny:bagel` (module docstring) into `folder`."""
    write_tiny_bagel(folder, responsive_encoder=False)


@register_tiny_model("bagel_edit")
def build_tiny_bagel_edit(folder: Path) -> None:
    """Write `tiny:bagel_edit`: `tiny:bagel` with the responsive VAE encoder (module docstring)."""
    write_tiny_bagel(folder, responsive_encoder=True)


def write_tiny_bagel(folder: Path, responsive_encoder: bool) -> None:
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
    from safetensors.torch import save_file

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
         "max_latent_size": TINY_MAX_LATENT, "vit_max_num_patch_per_side": TINY_VIT_SIDE}, indent=2))

    network = BagelNetwork(LLMConfig(**{k: llm[k] for k in LLMConfig.__dataclass_fields__}), TINY_MAX_LATENT,
                           TINY_VIT["hidden_size"], vit_max_patches_per_side=TINY_VIT_SIDE)
    with torch.no_grad():
        network.language_model.model.embed_tokens.weight.normal_(0, 1)
    tensors = {k: v.contiguous() for k, v in network.state_dict().items()}
    vit = SiglipTower(vit_config(folder))
    tensors.update({official_name(k): v.contiguous() for k, v in vit.model.state_dict().items()})
    save_file(tensors, str(folder / "ema.safetensors"), metadata={"format": "pt"})

    vae = AutoencoderKL(**TINY_VAE)
    make_kl_decoder_responsive(vae)
    if responsive_encoder:
        make_kl_encoder_responsive(vae)
    diffusers_state = vae.state_dict()
    bfl = vae_to_bfl(diffusers_state, len(TINY_VAE["up_block_types"]))
    back = convert_ldm_vae_checkpoint(bfl, TINY_VAE)
    if set(back) != set(diffusers_state) or any(not torch.equal(back[k], diffusers_state[k]) for k in back):
        raise RuntimeError("tiny:bagel: the BFL layout of the tiny VAE does not convert back through diffusers")
    save_file({k: v.contiguous() for k, v in bfl.items()}, str(folder / "ae.safetensors"))
    (folder / VAE_CONFIG).write_text(json.dumps(TINY_VAE, indent=2))

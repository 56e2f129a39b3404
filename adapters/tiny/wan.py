"""`tiny:wan22` (two experts, boundary 0.875) and `tiny:wan22_ti2v` (one expert, per-token
timesteps, a residual VAE with pixel patches) are random-weight models for tests and CPU demos.
The builders of the adapter in `adapters/wan.py`."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omni_rl.models import register_tiny_model
from omni_rl.models.tiny_vocab import t5_char_vocab

from adapters.tiny.decoders import make_causal_vae_decoder_responsive, wan_blocks


def _tiny_text_parts():
    from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

    tokenizer = T5Tokenizer(vocab=t5_char_vocab(), extra_ids=0, model_max_length=512)
    config = UMT5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    return tokenizer, UMT5EncoderModel(config)


def _tiny_transformer(channels: int) -> nn.Module:
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=channels,
        out_channels=channels, text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )


def _save_tiny(folder: Path, transformers: list[nn.Module], vae: nn.Module, **pipeline_config) -> None:
    from diffusers import UniPCMultistepScheduler, WanPipeline

    tokenizer, text_encoder = _tiny_text_parts()
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        # What Wan checkpoints ship; the adapter reads its `flow_shift` into an Euler schedule.
        scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0),
        transformer=transformers[0],
        transformer_2=transformers[1] if len(transformers) > 1 else None,
        **pipeline_config,
    )
    pipe.save_pretrained(Path(folder))


@register_tiny_model("wan22")
def build_tiny_wan22(folder: Path) -> None:
    """A tiny random-weight Wan2.2 A14B: two experts (boundary_ratio 0.875), a UMT5 encoder with
    a character vocabulary, and a 16-channel VAE with Wan2.1's factors (4 frames, 8 pixels);
    32x32 px and 5 frames give a [16, 2, 4, 4] latent. Seeded: the same weights every time.

    The decoder is deterministic and responsive to its latents: each pixel's brightness is an
    increasing function of the mean latent at its position (`adapters/tiny/decoders.py`)."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    experts = [_tiny_transformer(16), _tiny_transformer(16)]
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
        scale_factor_temporal=4, scale_factor_spatial=8,
    )
    make_causal_vae_decoder_responsive(vae, wan_blocks())
    _save_tiny(folder, experts, vae, boundary_ratio=0.875)


@register_tiny_model("wan22_ti2v")
def build_tiny_wan22_ti2v(folder: Path) -> None:
    """A tiny random-weight Wan2.2 TI2V-5B: one transformer with per-token timesteps
    (`expand_timesteps`) and, like the real one, a residual VAE over 2x2 pixel patches (12
    channels in and out); factors 4 frames / 8 pixels, so 32x32 px and 5 frames give a
    [16, 2, 4, 4] latent. Seeded. The decoder is made responsive as for `tiny:wan22`."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(1)
    vae = AutoencoderKLWan(
        base_dim=8, decoder_base_dim=8, z_dim=16, dim_mult=[1, 1, 1], num_res_blocks=1,
        temperal_downsample=[True, True], is_residual=True, in_channels=12, out_channels=12, patch_size=2,
        scale_factor_temporal=4, scale_factor_spatial=8,
    )
    make_causal_vae_decoder_responsive(vae, wan_blocks())
    _save_tiny(folder, [_tiny_transformer(16)], vae, expand_timesteps=True)

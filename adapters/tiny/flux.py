"""`tiny:flux` builds a seeded random-weight FLUX.1 (one double- and one single-stream block, CLIP
and
T5 of hidden size 32 with byte- and character-level tokenizers, a 4-level VAE whose decoder
responds to the latent) for tests and the CPU demo.
The builders of the adapter in `adapters/flux.py`."""
from __future__ import annotations

from pathlib import Path

import torch

from omni_rl.models import register_tiny_model
from omni_rl.models.tiny_vocab import bpe_files, clip_byte_vocab, t5_char_vocab

from adapters.tiny.decoders import make_kl_vae_decoder_responsive
from adapters.flux import MAX_TEXT_TOKENS


def _tiny_clip():
    """A byte-level CLIP tokenizer (77 tokens) and a 2-layer CLIP text model (hidden 32: the pooled
    projection's width)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab = clip_byte_vocab()
    with bpe_files(vocab) as (vocab_file, merges_file):
        tokenizer = CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=77)
    config = CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
        max_position_embeddings=77, bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|endoftext|>"],
    )
    return tokenizer, CLIPTextModel(config)


def _tiny_t5():
    """A character-level T5 tokenizer and a 2-layer T5 encoder (d_model 32)."""
    from transformers import T5Config, T5EncoderModel, T5Tokenizer

    tokenizer = T5Tokenizer(vocab=t5_char_vocab(), extra_ids=0, model_max_length=MAX_TEXT_TOKENS)
    config = T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=32, feed_forward_proj="gated-gelu",
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    return tokenizer, T5EncoderModel(config)


def build_tiny_flux_components() -> dict:
    """The seeded components of `tiny:flux` (also `tiny:flux_kontext`'s): CLIP and T5 of hidden size
    32, a transformer of one double- and one single-stream block (2 heads of 16, RoPE axes
    (4, 6, 6), the guidance embedding on, as FLUX.1-dev's), and a 16-channel 4-level VAE (8 px a
    latent pixel, FLUX.1's scaling and shift factors) whose decoder responds to its latents
    (`adapters/tiny/decoders.py`). 32x32 px give a [16, 4, 4] latent, 4 transformer tokens.

    The scheduler has FLUX.1-dev's settings (shift 3, dynamic shifting between 0.5 and 1.15 over
    256..4096 tokens), as its checkpoint's scheduler_config.json sets them."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel

    torch.manual_seed(0)
    tokenizer, text_encoder = _tiny_clip()
    tokenizer_2, text_encoder_2 = _tiny_t5()
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),
    )
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(16, 16, 16, 16), layers_per_block=1,
        norm_num_groups=1, down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        use_quant_conv=False, use_post_quant_conv=False, scaling_factor=0.3611, shift_factor=0.1159,
    )
    make_kl_vae_decoder_responsive(vae)
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_image_seq_len=256, max_image_seq_len=4096,
        base_shift=0.5, max_shift=1.15,
    )
    return dict(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2, transformer=transformer)


@register_tiny_model("flux")
def build_tiny_flux(folder: Path) -> None:
    """A tiny seeded random-weight FLUX.1 (`build_tiny_flux_components`), saved as a `FluxPipeline`."""
    from diffusers import FluxPipeline

    FluxPipeline(**build_tiny_flux_components()).save_pretrained(Path(folder))

"""`tiny:sd3` builds a ~100k-parameter random-weight SD3 (two MMDiT blocks, a one-block VAE, two
tiny
CLIP encoders with a byte-level vocabulary, no T5) for tests and the CPU demo.
The builders of the adapter in `adapters/sd3.py`."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from omni_rl.models import register_tiny_model
from omni_rl.models.tiny_vocab import bpe_files, clip_byte_vocab, with_whole_words


def tiny_text_encoders(words: Sequence[str] = (), max_length: int = 77):
    """(tokenizer, text encoder) x 2 of the tiny SD3s: byte-level CLIP tokenizers and two-layer
    CLIP text encoders (hidden 32, projection 32), seeded by the caller; no T5. `words` become
    whole tokens (`with_whole_words`: the shape model's closed caption vocabulary) and every
    prompt is padded to `max_length` tokens."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

    vocab, merges = with_whole_words(clip_byte_vocab(), list(words)) if words else (clip_byte_vocab(), [])
    with bpe_files(vocab, merges) as (vocab_file, merges_file):
        tokenizer = CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=max_length)
    text_config = CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_hidden_layers=2, projection_dim=32, max_position_embeddings=max_length,
        bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"],
    )
    return dict(
        text_encoder=CLIPTextModelWithProjection(text_config), tokenizer=tokenizer,
        text_encoder_2=CLIPTextModelWithProjection(text_config), tokenizer_2=tokenizer,
        text_encoder_3=None, tokenizer_3=None,
    )


@register_tiny_model("sd3")
def build_tiny_sd3(folder: Path) -> None:
    """Write a tiny random-weight SD3 with `save_pretrained` (seeded: the same weights every time)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    folder = Path(folder)
    torch.manual_seed(0)
    encoders = tiny_text_encoders()
    transformer = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=64,
        caption_projection_dim=32, pooled_projection_dim=64, pos_embed_max_size=32,
    )
    # One decoder block (no upsampling) and a single normalisation group: the decoder's
    # GroupNorms then keep each latent channel's offset relative to the others, so colour and
    # brightness respond to the latents. With several groups a random decoder normalises almost
    # all latent information away and no reward could be learned from its images.
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, layers_per_block=1, norm_num_groups=1,
        down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
        block_out_channels=(16,), use_quant_conv=False, use_post_quant_conv=False,
        shift_factor=0.0609, scaling_factor=1.5305,
    )
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae, **encoders,
    )
    pipe.save_pretrained(folder)

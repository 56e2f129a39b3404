"""`tiny:qwen_image` builds a seeded random-weight Qwen-Image for tests and the CPU demo.
The builders of the adapter in `adapters/qwen_image.py`."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omni_rl.models import register_tiny_model
from omni_rl.models.tiny_vocab import bpe_files, byte_chars

from adapters.tiny.decoders import make_causal_vae_decoder_responsive, qwen_image_blocks


# Qwen2.5-VL's special tokens that the chat template and the model config name.
_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
    "<|video_pad|>",
)


def _tiny_tokenizer():
    """A byte-level Qwen2 tokenizer (every byte a token, no merges) with Qwen2.5-VL's special
    tokens, built offline."""
    from transformers import Qwen2Tokenizer

    chars = byte_chars()
    with bpe_files({chars[b]: b for b in range(256)}) as (vocab, merges):
        tokenizer = Qwen2Tokenizer(
            str(vocab), str(merges), unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        )
    tokenizer.add_special_tokens({"additional_special_tokens": list(_SPECIAL_TOKENS[1:])})
    return tokenizer


def _tiny_text_encoder(tokenizer) -> nn.Module:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in _SPECIAL_TOKENS}
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            # Multimodal RoPE: 8-dim heads, sections (t, h, w) summing to head_dim / 2.
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1]},
            pad_token_id=ids["<|endoftext|>"], bos_token_id=None, eos_token_id=ids["<|im_end|>"],
        ),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                           patch_size=14, fullatt_block_indexes=[0]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    return Qwen2_5_VLForConditionalGeneration(config)


def build_tiny_qwen_image_components(**transformer_options) -> dict:
    """The seeded components of `tiny:qwen_image` (also `tiny:qwen_image_edit`'s): a 2-layer
    Qwen2.5-VL text encoder (hidden 32, a 1-block vision tower) with a byte-level tokenizer, a
    2-block transformer (2 heads of 16, 64-channel packed tokens) and a 16-channel VAE with the
    real factors (8 px, Qwen-Image's latent statistics), whose decoder responds to its latents
    (`adapters/tiny/decoders.py`). 32x32 px give a [16, 1, 4, 4] latent, 4 transformer tokens.

    The scheduler has Qwen-Image's dynamic-shift settings (base/max image sequence length 256 /
    8192, shift 0.5 / 0.9, exponential time shift, terminal sigma 0.02), as its checkpoint's
    scheduler_config.json sets them. `transformer_options` go to the transformer's constructor
    (the same seeded weights: the options do not add parameters)."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel

    torch.manual_seed(0)
    tokenizer = _tiny_tokenizer()
    text_encoder = _tiny_text_encoder(tokenizer)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, axes_dims_rope=(4, 6, 6), **transformer_options,
    )
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                 temperal_downsample=[False, True, True])
    make_causal_vae_decoder_responsive(vae, qwen_image_blocks())
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_image_seq_len=256, max_image_seq_len=8192,
        base_shift=0.5, max_shift=0.9, shift_terminal=0.02, time_shift_type="exponential",
    )
    return dict(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)


@register_tiny_model("qwen_image")
def build_tiny_qwen_image(folder: Path) -> None:
    """A tiny seeded random-weight Qwen-Image (`build_tiny_qwen_image_components`), saved as a
    `QwenImagePipeline`."""
    from diffusers import QwenImagePipeline

    QwenImagePipeline(**build_tiny_qwen_image_components()).save_pretrained(Path(folder))

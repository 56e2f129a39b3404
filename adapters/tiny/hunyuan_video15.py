"""`tiny:hunyuan_video15` builds a seeded random-weight HunyuanVideo-1.5 for tests and demos.
The builders of the adapter in `adapters/hunyuan_video15.py`."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omni_rl.models import register_tiny_model
from omni_rl.models.tiny_vocab import bpe_files, byte_chars

from adapters.tiny.decoders import make_hunyuan_video15_decoder_responsive


# Qwen2.5-VL's special tokens that the chat template and the model config name.
_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen2.5-VL's chat template as it renders text-only turns (its image/video branches dropped).
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _tiny_tokenizer():
    """A byte-level Qwen2 tokenizer (every byte a token, no merges) with Qwen's chat tokens and
    template, padding on the right (as the converted checkpoint's), built offline."""
    from transformers import Qwen2Tokenizer

    chars = byte_chars()
    with bpe_files({chars[b]: b for b in range(256)}) as (vocab, merges):
        tokenizer = Qwen2Tokenizer(
            str(vocab), str(merges), unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
            padding_side="right",
        )
    tokenizer.add_special_tokens({"additional_special_tokens": list(_SPECIAL_TOKENS[1:])})
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


def _tiny_text_encoder(tokenizer) -> nn.Module:
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    config = Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        # Multimodal RoPE: 8-dim heads, sections (t, h, w) summing to head_dim / 2.
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1]},
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    return Qwen2_5_VLTextModel(config)


def _tiny_glyph_parts():
    """ByT5's byte tokenizer (built offline: it has no vocabulary file) and a 1-layer T5 encoder."""
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    tokenizer = ByT5Tokenizer()
    config = T5Config(
        vocab_size=len(tokenizer), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
        relative_attention_num_buckets=8, relative_attention_max_distance=32, feed_forward_proj="gated-gelu",
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    return tokenizer, T5EncoderModel(config)


@register_tiny_model("hunyuan_video15")
def build_tiny_hunyuan_video15(folder: Path) -> None:
    """A tiny seeded random-weight HunyuanVideo-1.5 t2v, saved as a `HunyuanVideo15Pipeline`: a
    3-layer Qwen2.5-VL language model (hidden 32) with a byte-level tokenizer and Qwen's chat
    template, a 1-layer ByT5 encoder (d_model 16), a 2-block transformer (2 heads of 8, 8 latent
    channels: 17 inputs) and a VAE with the real factors (16 px, 4 frames) whose decoder
    responds to its latents (`adapters/tiny/decoders.py`). 32x32 px and 5 frames give an
    [8, 2, 2, 2] latent. The scheduler and guider are the 480p t2v checkpoint's (shift 5, CFG 6)."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15, ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline, HunyuanVideo15Transformer3DModel,
    )

    torch.manual_seed(0)
    tokenizer = _tiny_tokenizer()
    text_encoder = _tiny_text_encoder(tokenizer)
    tokenizer_2, text_encoder_2 = _tiny_glyph_parts()
    latent = 8
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=2 * latent + 1, out_channels=latent, num_attention_heads=2, attention_head_dim=8, num_layers=2,
        num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=32, text_embed_2_dim=16,
        image_embed_dim=8, rope_axes_dim=(2, 2, 4), target_size=64, task_type="t2v",
    )
    # Narrow late blocks keep the decoder cheap at full resolution (it runs once per sample).
    vae = AutoencoderKLHunyuanVideo15(latent_channels=latent, block_out_channels=(4, 8, 8, 16, 16), layers_per_block=1)
    make_hunyuan_video15_decoder_responsive(vae)
    HunyuanVideo15Pipeline(
        text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2, guider=ClassifierFreeGuidance(guidance_scale=6.0),
    ).save_pretrained(Path(folder))

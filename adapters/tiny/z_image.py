"""`tiny:z_image` builds a seeded random-weight Z-Image for tests and the CPU demo.
The builders of the adapter in `adapters/z_image.py`."""
from __future__ import annotations

from pathlib import Path

import torch

from omni_rl.models import register_tiny_model

from adapters.tiny.decoders import make_kl_vae_decoder_responsive


# Qwen3's chat template for one turn (its real template renders the same text for a user message:
# an empty think block only when enable_thinking is false, which the pipeline does not ask for).
QWEN3_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def build_tiny_z_image_components() -> dict:
    """The seeded components of `tiny:z_image`: a 2-layer Qwen3 text encoder (hidden 32) with a
    byte-level tokenizer and Qwen3's chat template, a transformer of 2 blocks and 1 refiner block
    each for noise and caption (dim 32, 2 heads of 16, Z-Image's patch 2 and rotary theta 256), a
    16-channel AutoencoderKL with the real factor (4 blocks: 8 px; Z-Image's scaling and shift;
    4 channels a norm group) whose decoder responds to its latents (`adapters/tiny/decoders.py`), and Z-Image-Turbo's
    scheduler (static shift 3). 32x32 px give a [16, 4, 4] latent, 4 transformer tokens."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    from adapters.tiny.qwen3 import build_byte_tokenizer

    torch.manual_seed(0)
    tokenizer = build_byte_tokenizer()
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    text_encoder = Qwen3Model(Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=1024, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    ))
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2,
        n_kv_heads=2, cap_feat_dim=32, rope_theta=256.0, t_scale=1000.0, axes_dims=[4, 6, 6], axes_lens=[1536, 512, 512],
    )
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, layers_per_block=1, norm_num_groups=2,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 8, 8), use_quant_conv=False, use_post_quant_conv=False,
        scaling_factor=0.3611, shift_factor=0.1159,
    )
    make_kl_vae_decoder_responsive(vae)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    return dict(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)


@register_tiny_model("z_image")
def build_tiny_z_image(folder: Path) -> None:
    """A tiny seeded random-weight Z-Image (`build_tiny_z_image_components`), saved as a `ZImagePipeline`."""
    from diffusers import ZImagePipeline

    ZImagePipeline(**build_tiny_z_image_components()).save_pretrained(Path(folder))

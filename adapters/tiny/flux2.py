"""`tiny:flux2` builds a seeded random-weight FLUX.2 [klein] base and `tiny:flux2_dev` a FLUX.2
[dev], for tests and the CPU demo.
The builders of the adapter in `adapters/flux2.py`."""
from __future__ import annotations

from pathlib import Path

import torch

from omni_rl.models import register_tiny_model

from adapters.tiny.decoders import make_kl_vae_decoder_responsive_by_stats
from adapters.flux2 import PATCH


# Qwen3's chat template as the pipeline calls it (one user turn, the generation prompt, and with
# enable_thinking=False the empty think block Qwen3's own template writes).
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
# Hidden states the tiny encoder has (0..TINY_LAYERS): enough for the pipeline's default (9, 18, 27).
TINY_LAYERS = 27


def _tiny_tokenizer():
    from adapters.tiny.qwen3 import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    tokenizer.chat_template = QWEN3_TEMPLATE
    return tokenizer


def build_tiny_flux2_components() -> dict:
    """The seeded components of `tiny:flux2`: a 27-layer Qwen3 (hidden 16, so the pipeline's
    layers 9/18/27 give 48-wide embeddings) with a byte-level tokenizer, a transformer of one
    double- and one single-stream block (2 heads of 16, 128-channel tokens) and a 32-channel
    `AutoencoderKLFlux2` with the real factors (8 px, 2x2 batch-norm patches; seeded running
    statistics, the same for a channel's four patch positions) whose decoder responds to its
    latents (`adapters/tiny/decoders.py`). 32x32 px give a [128, 2, 2] latent, 4 tokens.

    The scheduler is the klein checkpoints' (dynamic shifting; the pipeline passes mu)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    tokenizer = _tiny_tokenizer()
    text_encoder = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=TINY_LAYERS,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=1024,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    ))
    transformer, vae, scheduler = _tiny_transformer_vae_scheduler(guidance_embeds=False)
    return dict(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)


def _tiny_transformer_vae_scheduler(guidance_embeds: bool) -> tuple:
    """The tiny FLUX.2 transformer, responsive VAE and scheduler both tiny models share (drawn
    from torch's global generator after the text encoder; the VAE's statistics from their own)."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel

    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=128, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=3 * 16, timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4), guidance_embeds=guidance_embeds,
    )
    vae = AutoencoderKLFlux2(
        block_out_channels=(16, 16, 16, 16), layers_per_block=1, norm_num_groups=4, latent_channels=32,
    )
    gen = torch.Generator().manual_seed(1)
    mean = torch.randn(32, generator=gen) * 0.5
    std = 0.5 + torch.rand(32, generator=gen)
    vae.bn.running_mean.copy_(mean.repeat_interleave(PATCH * PATCH))
    vae.bn.running_var.copy_((std**2).repeat_interleave(PATCH * PATCH) - vae.config.batch_norm_eps)
    make_kl_vae_decoder_responsive_by_stats(vae, mean, std, gain=1.0)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True)
    return transformer, vae, scheduler


@register_tiny_model("flux2")
def build_tiny_flux2(folder: Path) -> None:
    """A tiny seeded random-weight FLUX.2 [klein] base (`build_tiny_flux2_components`; not
    distilled, so CFG is exercised), saved as a `Flux2KleinPipeline`."""
    from diffusers import Flux2KleinPipeline

    Flux2KleinPipeline(**build_tiny_flux2_components(), is_distilled=False).save_pretrained(Path(folder))


# Mistral-3's chat template as the pipeline's messages need it (a system turn and a user turn,
# each a list of text parts): [SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST].
MISTRAL3_TEMPLATE = (
    "{%- for m in messages %}{%- if m['content'] is string %}{%- set text = m['content'] %}{%- else %}"
    "{%- set text = m['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') %}"
    "{%- endif %}{%- if m['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{%- elif m['role'] == 'user' %}[INST]{{ text }}[/INST]{%- endif %}{%- endfor %}"
)
# Hidden states the tiny Mistral has (0..TINY_DEV_LAYERS): enough for the pipeline's (10, 20, 30).
TINY_DEV_LAYERS = 30


def build_tiny_flux2_dev_components() -> dict:
    """The seeded components of `tiny:flux2_dev`: a 30-layer Mistral-3 (hidden 16; a one-layer
    Pixtral vision tower the text path never runs) with a Pixtral processor around a byte-level
    tokenizer and the template above, and `tiny:flux2`'s transformer (with a guidance embedding),
    VAE and scheduler."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PixtralImageProcessor, PixtralProcessor

    from adapters.tiny.qwen3 import build_byte_tokenizer

    torch.manual_seed(0)
    tokenizer = build_byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]})
    processor = PixtralProcessor(image_processor=PixtralImageProcessor(), tokenizer=tokenizer,
                                 chat_template=MISTRAL3_TEMPLATE)
    text_encoder = Mistral3ForConditionalGeneration(Mistral3Config(
        text_config=dict(model_type="mistral", vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=TINY_DEV_LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                         max_position_embeddings=1024, pad_token_id=tokenizer.pad_token_id),
        vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, head_dim=8, patch_size=14, image_size=56),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"), spatial_merge_size=1,
    ))
    transformer, vae, scheduler = _tiny_transformer_vae_scheduler(guidance_embeds=True)
    return dict(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=processor, transformer=transformer)


@register_tiny_model("flux2_dev")
def build_tiny_flux2_dev(folder: Path) -> None:
    """A tiny seeded random-weight FLUX.2 [dev] (`build_tiny_flux2_dev_components`), saved as a
    `Flux2Pipeline`."""
    from diffusers import Flux2Pipeline

    Flux2Pipeline(**build_tiny_flux2_dev_components()).save_pretrained(Path(folder))

"""`tiny:minimax_h3` builds a seeded random-weight MiniMax-H3 (text to audio + video) whose video
and audio decoders respond to their latents. The builders of the adapter in `adapters/minimax_h3.py`.

MiniMax-H3 is a modular-only diffusers pipeline: the released checkpoint is in the modular layout,
a `modular_model_index.json` (`_class_name` MiniMaxH3ModularPipeline, one [library, class, loading
spec] entry per component) and each component in its subfolder. The builder writes that layout with
the pipeline's own `ModularPipeline.save_pretrained`; the project's model-folder check reads the
index (`omni_rl.models.loading.index_components`) and the adapter loads each component from its
subfolder."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from omni_rl.models import register_tiny_model

from adapters.tiny.qwen_image import _tiny_tokenizer

# The hub id the tiny model's modular_model_index.json names (no such repository exists).
TINY_HUB_ID = "omni-rl/tiny-minimax-h3"
# MiniMax-H3 conditions on hidden_states[50] of its Qwen3-VL encoder, a pipeline constant
# (`MiniMaxH3ModularPipeline.text_encoder_layer`), so even the tiny encoder has 51 layers.
TEXT_LAYERS = 51


def _tiny_text_encoder(tokenizer) -> nn.Module:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                           "<|vision_end|>", "<|endoftext|>")}
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=TEXT_LAYERS,
            num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1],
                             "mrope_interleaved": True},
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16,
                           patch_size=16, num_position_embeddings=16, deepstack_visual_indexes=[]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    return Qwen3VLForConditionalGeneration(config)


def _tiny_processor(tokenizer):
    """Qwen3-VL's processor on the tiny tokenizer (16 px patches merged 2x2); text-to-audio+video
    only reads its token-type ids."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(patch_size=16, merge_size=2), tokenizer=tokenizer,
                            video_processor=Qwen3VLVideoProcessor(patch_size=16, merge_size=2))


@torch.no_grad()
def _make_video_decoder_responsive(vae: nn.Module, gain: float = 1.0) -> None:
    """A deterministic ViT video decoder whose brightness follows the latents (a random one mixes
    them away):

    1. `post_quant_conv` is the identity; `proj_in` writes u = the mean over channels of the VAE
       latent into feature 0 and a constant 1 into feature 1;
    2. every transformer block adds nothing (its residual gates `scale1` / `scale2` are zero),
       so each token keeps (u, 1, 0, ...);
    3. the final LayerNorm (no affine) maps it to a value increasing in u, and `proj_out` writes
       `gain` times it into every pixel of the token's patch (the decoder's output is
       ImageNet-normalised RGB, which the pipeline maps back to [0, 1])."""
    decoder = vae.decoder
    conv = vae.post_quant_conv
    conv.weight.zero_()
    conv.bias.zero_()
    for c in range(conv.weight.shape[0]):
        conv.weight[c, c, 0, 0, 0] = 1.0
    decoder.proj_in.weight.zero_()
    decoder.proj_in.bias.zero_()
    decoder.proj_in.weight[0, :] = 1.0 / decoder.proj_in.weight.shape[1]
    decoder.proj_in.bias[1] = 1.0
    decoder.register_tokens.zero_()
    for block in decoder.transformer_blocks:  # each block's residual branches gated off
        block.scale1.zero_()
        block.scale2.zero_()
    decoder.norm_out.weight.fill_(1.0)
    decoder.norm_out.bias.zero_()
    decoder.proj_out.weight.zero_()
    decoder.proj_out.bias.zero_()
    decoder.proj_out.weight[:, 0] = gain


def _set_weight(conv: nn.Module, weight: torch.Tensor | None) -> None:
    """Set a (possibly weight-normalised) convolution's effective weight; None makes it zero. A
    weight-normed one is g * v / |v| per output row: v takes the weight (every row nonzero) and g
    its norms, or g = 0 (v left as it is) for zero."""
    if hasattr(conv, "weight_g"):
        if weight is None:
            conv.weight_g.zero_()
            return
        conv.weight_v.copy_(weight)
        conv.weight_g.copy_(weight.flatten(1).norm(dim=1).view_as(conv.weight_g))  # weight_norm's dim 0
    elif weight is None:
        conv.weight.zero_()
    else:
        conv.weight.copy_(weight)
    if conv.bias is not None:
        conv.bias.zero_()


@torch.no_grad()
def _make_audio_decoder_responsive(audio_vae: nn.Module) -> None:
    """A deterministic audio decoder whose waveform is an increasing function of the mean latent
    channel (a random BigVGAN's barely moves for a latent step):

    1. `dec_in_proj` and `conv_pre` average their input channels into every output channel (the
       current frame: the kernel's centre tap);
    2. each transposed convolution repeats every sample `stride` times, channels averaged;
    3. the residual AMP blocks add nothing (the second convolution of each pair is zero), so only
       the SnakeBeta activations, x + sin^2(x) at their initial parameters (non-decreasing), shape it;
    4. `conv_post` averages the channels into the waveform (clamped to [-1, 1] by the decoder)."""
    from diffusers.models.autoencoders.autoencoder_kl_minimax_h3_audio import MiniMaxH3AudioAMPBlock

    def average(conv: nn.Module, transposed: bool = False) -> None:
        weight = torch.zeros_like(conv.weight_v if hasattr(conv, "weight_v") else conv.weight)
        if transposed:  # [in, out, k]: output t * stride + j from input t
            stride, pad = conv.stride[0], conv.padding[0]
            weight[:, :, pad : pad + stride] = 1.0 / weight.shape[0]
        else:  # [out, in, k]
            weight[:, :, weight.shape[2] // 2] = 1.0 / weight.shape[1]
        _set_weight(conv, weight)

    decoder = audio_vae.decoder
    average(audio_vae.dec_in_proj)
    average(decoder.conv_pre)
    for up in decoder.ups:
        average(up[0], transposed=True)
    for block in decoder.modules():
        if isinstance(block, MiniMaxH3AudioAMPBlock):
            for conv in block.convs2:
                _set_weight(conv, None)
    average(decoder.conv_post)


@register_tiny_model("minimax_h3")
def build_tiny_minimax_h3(folder: Path) -> None:
    """A tiny seeded random-weight MiniMax-H3: a 51-layer Qwen3-VL text encoder of width 16 with a
    byte vocabulary, a 2-block transformer (width 32, one refiner layer), a video VAE with the real
    factors (16 px, 17-frame chunks of 5 latent frames: 32x32 px and 124 frames give a
    [4, 37, 2, 2] latent) and an audio VAE at 40 latents per second (the pipeline's constant;
    200 samples per latent, so 8 kHz, a rate the mp4's AAC encoder takes), and the two schedulers (shift 12 for video, 3 for audio)."""
    from diffusers import (
        AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Blocks, MiniMaxH3Scheduler,
        MiniMaxH3Transformer3DModel,
    )

    folder = Path(folder)
    torch.manual_seed(0)
    tokenizer = _tiny_tokenizer()
    text_encoder = _tiny_text_encoder(tokenizer)
    transformer = MiniMaxH3Transformer3DModel(
        num_attention_heads=2, attention_head_dim=16, hidden_size=32, num_layers=2, num_refiner_layers=1, ffn_dim=64,
        in_channels=4, audio_in_channels=4, patch_size=(1, 2, 2), text_dim=16, freq_dim=16,
        time_embed_hidden_dim=32, time_embed_dim=16, rope_freq_dim=2,
    )
    vae = AutoencoderKLMiniMaxH3(
        latent_channels=4, block_out_channels=(8, 8, 8, 8, 8, 8), layers_per_block=1, norm_num_groups=4,
        decoder_num_layers=1, decoder_num_attention_heads=2, decoder_attention_head_dim=8,
        decoder_num_register_tokens=1, decoder_ffn_mult=2,
        latents_mean=[-0.1, 0.0, 0.05, 0.1], latents_std=[0.8, 0.9, 1.1, 1.2],
    )
    audio_vae = AutoencoderKLMiniMaxH3Audio(
        encoder_dim=2, encoder_rates=(2, 4, 5, 5), latent_dim=8, latent_channels=4, num_attention_heads=2,
        decoder_dim=16, decoder_rates=(5, 5, 4, 2), decoder_kernel_sizes=(9, 9, 8, 4), resblock_kernel_sizes=(3,),
        resblock_dilation_sizes=((1,),), sampling_rate=8000, latents_mean=[0.0, 0.1, -0.1, 0.05], latents_std=[1.0, 0.9, 1.1, 1.0],
    )
    _make_video_decoder_responsive(vae)
    _make_audio_decoder_responsive(audio_vae)
    components = {
        "transformer": transformer, "vae": vae, "audio_vae": audio_vae, "text_encoder": text_encoder,
        "tokenizer": tokenizer, "processor": _tiny_processor(tokenizer),
        "scheduler": MiniMaxH3Scheduler(shift=12.0), "audio_scheduler": MiniMaxH3Scheduler(shift=3.0),
    }
    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(**components)
    pipe.save_pretrained(str(folder), overwrite_modular_index=True)
    # The saved index points every component at `folder`, a staging folder renamed once built. The
    # released index points at its hub id, and diffusers loads a local copy's components from the
    # copy (`_is_local_component`): the tiny index names a hub id too, one that holds nothing.
    index_file = folder / "modular_model_index.json"
    index = json.loads(index_file.read_text())
    for entry in index.values():
        if isinstance(entry, list) and len(entry) == 3 and entry[2].get("pretrained_model_name_or_path"):
            entry[2]["pretrained_model_name_or_path"] = TINY_HUB_ID
    index_file.write_text(json.dumps(index, indent=2))

"""`tiny:ltx2` builds a seeded random-weight LTX-2.3-style model (per-modality connectors, a
bandwidth-extending vocoder) whose video and audio decoders respond to their latents.
The builders of the adapter in `adapters/ltx2.py`."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omni_rl.models import register_tiny_model


def _tiny_tokenizer():
    """A Gemma tokenizer over bytes: Gemma's special tokens, then its 256 byte-fallback tokens
    (`<0x00>` ...), so every prompt tokenises (no merges, one token per byte) without a download."""
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}
    vocab.update({f"<0x{b:02X}>": 5 + b for b in range(256)})
    return GemmaTokenizer(vocab=vocab, merges=[], model_max_length=1024)


def _tiny_text_encoder(vocab_size: int) -> nn.Module:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config=dict(
            vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, max_position_embeddings=256, sliding_window=64, pad_token_id=0,
        ),
        vision_config=dict(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
            patch_size=14,
        ),
        mm_tokens_per_image=4, image_token_index=vocab_size - 1, boi_token_index=vocab_size - 2,
        eoi_token_index=vocab_size - 3,
    )
    return Gemma3ForConditionalGeneration(config)


def _pass_through(conv: nn.Module, copies: int = 1, tap: tuple[int, ...] | None = None, gain: float = 1.0) -> None:
    """Make a convolution copy input channel i to output channel i (`copies` stacked blocks of
    them: a depth-to-space upsampler's sub-positions) at kernel position `tap` (default: the
    centre), times `gain`; every other weight and the bias zero."""
    weight = conv.weight
    weight.zero_()
    if conv.bias is not None:
        conv.bias.zero_()
    tap = tuple(k // 2 for k in weight.shape[2:]) if tap is None else tap
    block = weight.shape[0] // copies
    for copy_ in range(copies):
        for i in range(min(block, weight.shape[1])):
            weight[(copy_ * block + i, i, *tap)] = gain


@torch.no_grad()
def _make_video_decoder_responsive(vae: nn.Module, gain: float = 0.5) -> None:
    """A deterministic video decoder whose brightness follows the latents (as `adapters/wan.py`
    does for Wan's): a random one normalises the latent's magnitude away.

    1. every resnet's second convolution is zero (each block is its shortcut), and each
       upsampler's convolution copies channel i into every sub-position of channel i (nearest
       upsampling; the upsamplers keep the channel count, `upsample_factor` 1);
    2. `conv_in` writes u = the mean over channels of the *normalised* latent
       ((z - mean) * scaling / std, the adapter's latent) into feature 0 and a constant 1 into feature 1;
    3. the last per-channel RMS norm gives feature 0 = sqrt(C) u / sqrt(1 + u^2), monotone in u,
       and `conv_out` sets every pixel channel to `gain * silu(feature 0)` (pixels in [-1, 1]).

    Latent 0 decodes to mid-grey, +0.5 to ~0.75 brightness (0..1 scale)."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx2 import LTX2VideoResnetBlock3d, LTX2VideoUpsampler3d

    decoder = vae.decoder
    # The decoder is not causal: the current frame is each kernel's middle time tap (1, 1, 1).
    for module in decoder.modules():
        if isinstance(module, LTX2VideoResnetBlock3d):
            module.conv2.conv.weight.zero_()
            module.conv2.conv.bias.zero_()
        elif isinstance(module, LTX2VideoUpsampler3d):
            s = module.stride
            conv = module.conv.conv
            conv.weight.zero_()
            conv.bias.zero_()
            channels = conv.weight.shape[1]
            for c in range(channels):  # output channel c * prod(stride) + k -> sub-position k of channel c
                for k in range(s[0] * s[1] * s[2]):
                    conv.weight[c * s[0] * s[1] * s[2] + k, c, 1, 1, 1] = 1.0
    channels = vae.config.latent_channels
    scale = vae.config.scaling_factor / vae.latents_std
    conv_in = decoder.conv_in.conv
    conv_in.weight.zero_()
    conv_in.bias.zero_()
    conv_in.weight[0, :, 1, 1, 1] = scale / channels
    conv_in.bias[0] = -(vae.latents_mean * scale).sum() / channels
    conv_in.bias[1] = 1.0
    conv_out = decoder.conv_out.conv
    conv_out.weight.zero_()
    conv_out.bias.zero_()
    conv_out.weight[:, 0, 1, 1, 1] = gain


@torch.no_grad()
def _make_audio_path_responsive(audio_vae: nn.Module, vocoder: nn.Module, gain: float = 1.0) -> None:
    """A deterministic audio VAE decoder and vocoder whose waveform follows the latents (a random
    vocoder's output does not move for a latent step: its input is normalised and mixed away).

    Audio VAE decoder, as the video one: resnets are their shortcuts, upsamplers (nearest x2, then
    a causal convolution) copy channels at the current frame (the causal kernel's last time tap);
    `conv_in` writes u = the mean latent channel into feature 0 and 1 into feature 1, the pixel
    norm gives sqrt(C) u / sqrt(1 + u^2) and `conv_out` writes `silu` of it into every mel bin.

    Vocoder (either kind): its residual blocks are identities, `conv_in` sums the mel bins into
    channel 0 (+1, so the leaky ReLUs see positive values), every transposed convolution repeats
    each sample `stride` times, and `conv_out` maps channel 0 to `tanh(gain (m - 1))` for the mean
    mel value m: the waveform is a smooth increasing function of the latent. With bandwidth
    extension the extender's output convolution is zero, so the output is the resampled waveform."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LTX2AudioResnetBlock, LTX2AudioUpsample
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, ResBlock

    decoder = audio_vae.decoder
    now = (2, 1)  # causal along time ("height"): the current frame is the last time tap
    for module in decoder.modules():
        if isinstance(module, LTX2AudioResnetBlock):
            module.conv2.conv.weight.zero_()
            module.conv2.conv.bias.zero_()
        elif isinstance(module, LTX2AudioUpsample):
            _pass_through(module.conv.conv, tap=now)
    conv_in = decoder.conv_in.conv
    conv_in.weight.zero_()
    conv_in.bias.zero_()
    conv_in.weight[0, :, 2, 1] = 1.0 / conv_in.weight.shape[1]
    conv_in.bias[1] = 1.0
    conv_out = decoder.conv_out.conv
    conv_out.weight.zero_()
    conv_out.bias.zero_()
    conv_out.weight[:, 0, 2, 1] = 1.0

    stages = [vocoder] if isinstance(vocoder, LTX2Vocoder) else [vocoder.vocoder]
    for stage in stages:
        for block in stage.modules():
            if isinstance(block, ResBlock):
                for conv in block.convs2:
                    conv.weight.zero_()
                    conv.bias.zero_()
        stage.conv_in.weight.zero_()
        stage.conv_in.bias.zero_()
        stage.conv_in.weight[0, :, 3] = 1.0 / stage.conv_in.weight.shape[1]
        stage.conv_in.bias[0] = 1.0
        for up in stage.upsamplers:
            stride, pad = up.stride[0], up.padding[0]
            up.weight.zero_()
            up.bias.zero_()
            up.weight[0, 0, pad : pad + stride] = 1.0  # output t * stride + j comes from input t
        stage.conv_out.weight.zero_()
        stage.conv_out.weight[:, 0, 3] = gain
        if stage.conv_out.bias is not None:
            stage.conv_out.bias.fill_(-gain)
    if not isinstance(vocoder, LTX2Vocoder):
        vocoder.bwe_generator.conv_out.weight.zero_()


@register_tiny_model("ltx2")
def build_tiny_ltx2(folder: Path) -> None:
    """A tiny seeded random-weight LTX-2.3: a 2-layer Gemma-3 text encoder with a byte
    vocabulary, per-modality connectors with learnable registers, a 2-block transformer, a video
    VAE with LTX-2's factors (8 frames, 32 px: 32x32 px and 9 frames give a [8, 2, 1, 1] latent),
    an audio VAE (16 kHz, hop 160, 8 mel bins: 9 frames at 24 fps give a [2, 9, 2] latent) and a
    vocoder with bandwidth extension (16 -> 32 kHz). The decoders respond to their latents
    (`_make_video_decoder_responsive`, `_make_audio_path_responsive`)."""
    from diffusers import (
        AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE

    torch.manual_seed(0)
    tokenizer = _tiny_tokenizer()
    text_encoder = _tiny_text_encoder(len(tokenizer) + 3)
    text = text_encoder.config.text_config
    connectors = LTX2TextConnectors(
        caption_channels=text.hidden_size, text_proj_in_factor=text.num_hidden_layers + 1,
        video_connector_num_attention_heads=2, video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=8, audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=4, audio_connector_num_layers=1, audio_connector_num_learnable_registers=8,
        connector_rope_base_seq_len=32, rope_double_precision=False, rope_type="split",
        per_modality_projections=True, video_hidden_dim=16, audio_hidden_dim=8,
    )
    transformer = LTX2VideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
        audio_cross_attention_dim=8, num_layers=2, caption_channels=16, rope_double_precision=False,
        rope_type="split", use_prompt_embeddings=False, cross_attn_mod=True, audio_cross_attn_mod=True,
        gated_attn=True, audio_gated_attn=True, perturbed_attn=True,  # as LTX-2.3's: its blocks can do STG
    )
    vae = AutoencoderKLLTX2Video(
        latent_channels=8, block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True, False),
        downsample_type=("spatiotemporal", "spatiotemporal", "spatiotemporal", "spatial"),
        decoder_block_out_channels=(8, 8, 8), decoder_layers_per_block=(1, 1, 1, 1),
        decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(False,) * 4,
        upsample_residual=(False, False, False), upsample_factor=(1, 1, 1), decoder_causal=False,
        decoder_spatial_padding_mode="zeros", patch_size=4, scaling_factor=1.0,
    )
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1, 1, 1), num_res_blocks=1, latent_channels=2, mel_bins=8,
        sample_rate=16000, mel_hop_length=160, resolution=32,
    )
    # Statistics that are not 0 / 1, so the tests see every (un)normalisation.
    with torch.no_grad():
        vae.latents_mean.copy_(torch.linspace(-0.2, 0.2, 8))
        vae.latents_std.copy_(torch.linspace(0.8, 1.2, 8))
        audio_vae.latents_mean.copy_(torch.linspace(-0.1, 0.1, 4))
        audio_vae.latents_std.copy_(torch.linspace(0.9, 1.1, 4))
    vocoder = LTX2VocoderWithBWE(
        in_channels=2 * 8, hidden_channels=16, out_channels=2, upsample_kernel_sizes=[8, 8, 20],
        upsample_factors=[4, 4, 10], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3]], act_fn="leaky_relu",
        antialias=False, final_act_fn=None, final_bias=True, bwe_in_channels=2 * 8, bwe_hidden_channels=16,
        bwe_out_channels=2, bwe_upsample_kernel_sizes=[8, 8, 20], bwe_upsample_factors=[4, 4, 10],
        bwe_resnet_kernel_sizes=[3], bwe_resnet_dilations=[[1, 3]], bwe_act_fn="leaky_relu", bwe_antialias=False,
        filter_length=128, hop_length=80, window_length=128, num_mel_channels=8, input_sampling_rate=16000,
        output_sampling_rate=32000,
    )
    _make_video_decoder_responsive(vae)
    _make_audio_path_responsive(audio_vae, vocoder)
    # LTX-2's schedule: shifted by the video token count, stretched to end at 0.1 before the final 0.
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05, base_image_seq_len=1024, max_image_seq_len=4096,
        shift_terminal=0.1, time_shift_type="exponential",
    )
    pipe = LTX2Pipeline(
        scheduler=scheduler, vae=vae, audio_vae=audio_vae, text_encoder=text_encoder, tokenizer=tokenizer,
        connectors=connectors, transformer=transformer, vocoder=vocoder,
    )
    pipe.save_pretrained(Path(folder))

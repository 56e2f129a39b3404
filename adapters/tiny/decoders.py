"""Deterministic decoders for the tiny Wan-style video VAEs (Wan2.1/2.2, Qwen-Image's VAE).

A random decoder of these causal-convolution VAEs stacks random convolutions, residual branches
that add noise of the signal's own size and RMS norms over channels that divide every position's
magnitude away: a latent step moves its mean brightness by 0.002-0.03 (0..1 scale), so no reward
could be learned from its pixels. `make_causal_vae_decoder_responsive(vae, blocks)` replaces the
decoder's weights by a construction whose brightness follows the latent:

1. every residual branch and attention output is zero (each block is its shortcut) and every
   other convolution passes its first channels through (current frame, kernel centre);
2. `conv_in` writes u = the mean over channels of the *normalised* latent
   ((z - latents_mean) / latents_std) into feature 0 and a constant 1 into feature 1;
3. the last RMS norm then gives feature 0 = sqrt(C) u / sqrt(1 + u^2), monotone in u, and
   `conv_out` sets every output channel to `gain * silu(feature 0)` (pixels in [-1, 1]).

So each pixel is a smooth increasing function of the mean latent at its position (8x8 pixel
blocks of one value): latent 0 decodes to mid-grey, +1 to ~0.94 brightness. The adapters' tests
measure it (tests/adapters/test_wan_adapter.py, test_qwen_image_adapter.py). The weights do
not depend on the seed; the tiny images are grey.

`make_kl_vae_decoder_responsive(vae)` does the same for a 2-D `AutoencoderKL` (FLUX.1's), whose
last norm is a GroupNorm (its docstring says how the construction allows for that);
`make_kl_vae_decoder_responsive_by_stats(vae, latents_mean, latents_std)` for one whose latents
are normalised per channel by mean and std (FLUX.2's `AutoencoderKLFlux2`);
`make_hunyuan_video15_decoder_responsive(vae)` for HunyuanVideo-1.5's video VAE, whose shortcuts
spread channels (its docstring).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn


class CausalVaeBlocks(NamedTuple):
    """The decoder's block classes of one VAE family (diffusers names them per family)."""

    residual: type
    attention: type
    resample: type
    causal_conv: type


def wan_blocks() -> CausalVaeBlocks:
    from diffusers.models.autoencoders.autoencoder_kl_wan import (
        WanAttentionBlock, WanCausalConv3d, WanResample, WanResidualBlock,
    )

    return CausalVaeBlocks(WanResidualBlock, WanAttentionBlock, WanResample, WanCausalConv3d)


def qwen_image_blocks() -> CausalVaeBlocks:
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import (
        QwenImageAttentionBlock, QwenImageCausalConv3d, QwenImageResample, QwenImageResidualBlock,
    )

    return CausalVaeBlocks(QwenImageResidualBlock, QwenImageAttentionBlock, QwenImageResample, QwenImageCausalConv3d)


def pass_through(conv: nn.Module, copies: int = 1) -> None:
    """Make a (causal) convolution copy its first input channels to its output channels at the
    current frame and the kernel's centre (`copies` stacked blocks of them: a time upsampler's
    two output frames); bias zero. The causal convolutions pad time on the left only, so the
    current frame is the kernel's last time tap."""
    weight = conv.weight
    weight.zero_()
    conv.bias.zero_()
    block = weight.shape[0] // copies
    tap = (weight.shape[2] - 1, *(k // 2 for k in weight.shape[3:])) if weight.dim() == 5 else (
        tuple(k // 2 for k in weight.shape[2:])
    )
    for copy in range(copies):
        for i in range(min(block, weight.shape[1])):
            weight[(copy * block + i, i, *tap)] = 1.0


@torch.no_grad()
def make_causal_vae_decoder_responsive(vae: nn.Module, blocks: CausalVaeBlocks, gain: float = 0.5) -> None:
    """Set `vae`'s decoder (and post-quant conv) to the construction in the module docstring."""
    decoder = vae.decoder
    for module in decoder.modules():
        if isinstance(module, blocks.residual):
            module.conv2.weight.zero_()
            module.conv2.bias.zero_()
            if isinstance(module.conv_shortcut, blocks.causal_conv):
                pass_through(module.conv_shortcut)
        elif isinstance(module, blocks.attention):
            module.proj.weight.zero_()
            module.proj.bias.zero_()
        elif isinstance(module, blocks.resample) and module.mode.startswith("upsample"):
            pass_through(module.resample[1])
            if hasattr(module, "time_conv"):
                pass_through(module.time_conv, copies=2)
    pass_through(vae.post_quant_conv)
    config = vae.config
    mean, std = torch.tensor(config.latents_mean), torch.tensor(config.latents_std)
    conv_in = decoder.conv_in
    conv_in.weight.zero_()
    conv_in.bias.zero_()
    conv_in.weight[0, :, -1, 1, 1] = 1.0 / (std * config.z_dim)
    conv_in.bias[0] = -(mean / std).sum() / config.z_dim
    conv_in.bias[1] = 1.0
    # conv_out reads silu(feature 0): the decoder applies silu between norm_out and conv_out.
    conv_out = decoder.conv_out
    conv_out.weight.zero_()
    conv_out.bias.zero_()
    conv_out.weight[:, 0, -1, 1, 1] = gain


def _kl_decoder_to_shortcuts(vae: nn.Module) -> None:
    """A 2-D KL decoder's residual branches and attention outputs zero, its shortcuts, upsamplers
    and post-quant conv passing their channels through: what is left to set is `conv_in`, the
    final norm and `conv_out`."""
    from diffusers.models.attention_processor import Attention
    from diffusers.models.resnet import ResnetBlock2D
    from diffusers.models.upsampling import Upsample2D

    for module in vae.decoder.modules():
        if isinstance(module, ResnetBlock2D):
            module.conv2.weight.zero_()
            module.conv2.bias.zero_()
            if module.conv_shortcut is not None:
                pass_through(module.conv_shortcut)
        elif isinstance(module, Attention):
            module.to_out[0].weight.zero_()
            module.to_out[0].bias.zero_()
        elif isinstance(module, Upsample2D) and module.conv is not None:
            pass_through(module.conv)
    if getattr(vae, "post_quant_conv", None) is not None:
        pass_through(vae.post_quant_conv)


@torch.no_grad()
def make_kl_vae_decoder_responsive(vae: nn.Module, gain: float = 0.5) -> None:
    """The same construction for a 2-D `AutoencoderKL` decoder (FLUX.1's VAE layout: ResNet
    blocks, a mid-block attention, nearest upsamplers, a final GroupNorm), whose latents are
    normalised as `(z - shift_factor) * scaling_factor`.

    The final norm is a GroupNorm over its group's channels *and* the image's positions, so
    feature 0 (u) shares its group with the constant feature 1 and the group's zero channels
    (C_g of them): for a uniform latent u it gives (u - (u + 1) / C_g) / sqrt((u^2 + 1) / C_g -
    ((u + 1) / C_g)^2), increasing in u; its affine bias adds 1 / sqrt(C_g - 1), the value's
    negation at u = 0, so latent 0 decodes to mid-grey as in the causal construction."""
    decoder = vae.decoder
    _kl_decoder_to_shortcuts(vae)
    config = vae.config
    scale, shift = float(config.scaling_factor), float(config.shift_factor or 0.0)
    conv_in = decoder.conv_in
    conv_in.weight.zero_()
    conv_in.bias.zero_()
    conv_in.weight[0, :, 1, 1] = scale / config.latent_channels
    conv_in.bias[0] = -scale * shift
    conv_in.bias[1] = 1.0
    norm = decoder.conv_norm_out
    group = norm.num_channels // norm.num_groups
    if group < 2:
        raise ValueError(f"the decoder's last GroupNorm has {group} channel(s) a group: the construction needs >= 2 "
                         f"(features 0 and 1 in one group)")
    norm.weight.fill_(1.0)
    norm.bias.zero_()
    norm.bias[0] = 1.0 / (group - 1) ** 0.5
    conv_out = decoder.conv_out
    conv_out.weight.zero_()
    conv_out.bias.zero_()
    conv_out.weight[:, 0, 1, 1] = gain


# --- the 2D KL decoder (diffusers' `vae.Decoder`: AutoencoderKL, AutoencoderKLFlux2) -----------
@torch.no_grad()
def make_kl_vae_decoder_responsive_by_stats(vae: nn.Module, latents_mean, latents_std, gain: float = 0.5,
                                   level: float = 1000.0) -> None:
    """Set the decoder (and post-quant conv) of a 2D KL VAE so that each pixel's brightness
    follows the mean normalised latent at its position, as `make_causal_vae_decoder_responsive`
    does for the causal video VAEs; `latents_mean` / `latents_std` are per latent channel (the
    normalisation the pipeline undoes before decoding).

    This decoder normalises with GroupNorms over channels *and* positions, which would remove a
    brightness shared by the whole image. So `conv_in` writes u = mean_c((z_c - mean_c) / std_c)
    into feature 0 and a constant `level` (>> u) into feature 1; every residual branch and
    attention output is zero and every upsampling convolution passes its channels through. The
    final GroupNorm's first group (n >= 3 channels: u, the constant and zeros; two channels
    alone would normalise to +-1 whatever u is) then has mean ~ level / n and std ~ sigma0 =
    level sqrt(n - 1) / n, both dominated by the constant, and its affine (weight sigma0, bias
    level / n) turns feature 0 into ~ u - mean(u) / n to first order in u / level: increasing in
    u at each position and in a shift of the whole image. `conv_out` sets every output channel
    to `gain * silu(feature 0)`: latent 0 decodes to mid-grey."""
    decoder = vae.decoder
    _kl_decoder_to_shortcuts(vae)
    mean = torch.as_tensor(latents_mean, dtype=torch.float32)
    std = torch.as_tensor(latents_std, dtype=torch.float32)
    channels = mean.numel()
    conv_in = decoder.conv_in
    conv_in.weight.zero_()
    conv_in.bias.zero_()
    conv_in.weight[0, :, 1, 1] = 1.0 / (std * channels)
    conv_in.bias[0] = -(mean / std).sum() / channels
    conv_in.bias[1] = level
    norm = decoder.conv_norm_out
    n = norm.num_channels // norm.num_groups
    if n < 3:
        raise ValueError(f"the decoder's last GroupNorm has {n} channels a group: expected at least 3 (feature 0, the "
                         f"constant and a zero share a group); build the tiny VAE with fewer norm groups")
    norm.weight.zero_()
    norm.bias.zero_()
    norm.weight[0] = level * (n - 1) ** 0.5 / n
    norm.bias[0] = level / n
    conv_out = decoder.conv_out
    conv_out.weight.zero_()
    conv_out.bias.zero_()
    conv_out.weight[:, 0, 1, 1] = gain


@torch.no_grad()
def make_hunyuan_video15_decoder_responsive(vae: nn.Module, gain: float = 1.0) -> None:
    """Set the decoder of an `AutoencoderKLHunyuanVideo15` so that each pixel's brightness is a
    smooth increasing function of the mean normalised latent u at its position (the latent the
    pipeline denoises; the VAE decodes it divided by `scaling_factor`).

    This VAE has no per-channel norms to route one feature through: its `conv_in` adds the latent
    repeated over channels, and every upsampler adds a shortcut that repeats channels and shuffles
    them into sub-pixels (`_dcae_upsample_rearrange`), so a single "feature 0" would be scattered.
    A value carried by *every* channel survives all of them unchanged, so:

    1. `conv_in` writes u into every feature (its weight cancels the repeated-latent shortcut);
    2. every residual branch and attention output is zero (each block is its shortcut), a 1x1
       channel-changing shortcut averages its inputs, and every upsampler's convolution is zero
       (its output is its shortcut: u everywhere, at every sub-pixel and frame);
    3. the last upsampler's convolution sets output channel 1 to the constant 1 (minus its
       shortcut's u) at every sub-pixel and frame phase: packed channel p lands on output
       channel p % c_out (the first frame keeps the even blocks, a subset of them);
    4. the RMS norm over the C final channels then gives feature 0 = sqrt(C) u / sqrt((C-1) u^2 + 1),
       increasing in u, and `conv_out` sets every output channel to `gain * silu(feature 0)`.

    Latent 0 decodes to mid-grey. The weights do not depend on the seed."""
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import (
        HunyuanVideo15AttnBlock, HunyuanVideo15ResnetBlock, HunyuanVideo15Upsample,
    )

    decoder = vae.decoder
    latent = decoder.in_channels
    # Execution order (the decoder registers `up_blocks` before `mid_block`, so modules() is not it).
    blocks = [*decoder.mid_block.resnets, *(a for a in decoder.mid_block.attentions if a is not None)]
    for up in decoder.up_blocks:
        blocks += [*up.resnets, *(up.upsamplers or [])]
    upsamplers = [b for b in blocks if isinstance(b, HunyuanVideo15Upsample)]
    if not upsamplers:
        raise ValueError("make_hunyuan_video15_decoder_responsive needs a decoder with at least one upsampler")
    after_last = False
    for block in blocks:
        if isinstance(block, HunyuanVideo15ResnetBlock):
            block.conv2.conv.weight.zero_()
            block.conv2.conv.bias.zero_()
            if block.conv_shortcut is not None:
                shortcut = block.conv_shortcut
                shortcut.bias.zero_()
                if after_last:  # past the constant channel: keep channels apart
                    pass_through(shortcut)
                else:  # u in every channel stays u in every channel
                    shortcut.weight.fill_(1.0 / shortcut.weight.shape[1])
        elif isinstance(block, HunyuanVideo15AttnBlock):
            block.proj_out.weight.zero_()
            block.proj_out.bias.zero_()
        elif isinstance(block, HunyuanVideo15Upsample):
            conv = block.conv.conv
            conv.weight.zero_()
            conv.bias.zero_()
            if block is upsamplers[-1]:
                factor = 8 if block.add_temporal_upsample else 4
                c_out, c_in = conv.out_channels // factor, conv.in_channels
                for p in range(1, conv.out_channels, c_out):  # every packed channel landing on channel 1
                    conv.weight[p, :, -1, 1, 1] = -1.0 / c_in
                    conv.bias[p] = 1.0
                after_last = True
    scale = float(vae.config.scaling_factor)
    conv_in = decoder.conv_in.conv
    conv_in.weight.zero_()
    conv_in.bias.zero_()
    conv_in.weight[:, :, -1, 1, 1] = scale / latent  # u = mean of scaling_factor * z
    for k in range(conv_in.out_channels):
        conv_in.weight[k, k // decoder.repeat, -1, 1, 1] -= 1.0  # cancels the repeated-latent shortcut
    decoder.norm_out.gamma.fill_(1.0)
    conv_out = decoder.conv_out.conv
    conv_out.weight.zero_()
    conv_out.bias.zero_()
    conv_out.weight[:, 0, -1, 1, 1] = gain

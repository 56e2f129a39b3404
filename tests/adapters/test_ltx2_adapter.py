"""The LTX-2 adapter (`LTX2Pipeline`) on `tiny:ltx2`: the shared diffusion adapter suite (video
and audio streams, tests/adapters/diffusion_suite.py), then its geometry errors, the schedule,
responsive video and audio decoders, and decode_audio's shape and rate."""
import copy

import pytest
import torch
from diffusers import LTX2Pipeline

from omni_rl.algos import latent_streams as ls
from tests.adapters.diffusion_suite import AdapterCase, DiffusionAdapterSuite, build, fresh_pipeline

SEQ = 32  # text tokens (a multiple of the tiny connectors' 8 learnable registers)
HEIGHT = WIDTH = 32
FRAMES = 9


def pipeline(model, fresh: bool):
    if fresh:
        return fresh_pipeline(LTX2Pipeline, model)
    pipe = LTX2Pipeline(**{**model.pipeline.components, "scheduler": copy.deepcopy(model.scheduler)})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def to_pipeline_space(pipe, latents: ls.LatentStreams):
    """The adapter's normalised streams -> the raw VAE latents `LTX2Pipeline(latents=, audio_latents=)` takes."""
    video = pipe._denormalize_latents(latents["video"], pipe.vae.latents_mean, pipe.vae.latents_std,
                                      pipe.vae.config.scaling_factor)
    audio = latents["audio"]
    packed = pipe._denormalize_audio_latents(pipe._pack_audio_latents(audio), pipe.audio_vae.latents_mean,
                                             pipe.audio_vae.latents_std)
    return video, pipe._unpack_audio_latents(packed, audio.shape[2], num_mel_bins=audio.shape[3])


def from_pipeline_space(pipe, video, audio) -> ls.LatentStreams:
    video = pipe._normalize_latents(video, pipe.vae.latents_mean, pipe.vae.latents_std, pipe.vae.config.scaling_factor)
    packed = pipe._normalize_audio_latents(pipe._pack_audio_latents(audio), pipe.audio_vae.latents_mean,
                                           pipe.audio_vae.latents_std)
    return ls.LatentStreams({
        "video": video, "audio": pipe._unpack_audio_latents(packed, audio.shape[2], num_mel_bins=audio.shape[3]),
    })


def pipeline_latents(pipe, prompt, latents, steps, guidance, case):
    video, audio = to_pipeline_space(pipe, latents)
    # Plain CFG on both streams: the pipeline's STG, modality guidance and rescale pinned off.
    video, audio = pipe(
        prompt=prompt, latents=video, audio_latents=audio, height=case.height, width=case.width,
        num_frames=case.num_frames, frame_rate=24.0, num_inference_steps=steps, guidance_scale=guidance,
        audio_guidance_scale=guidance, stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0,
        audio_modality_scale=1.0, guidance_rescale=0.0, audio_guidance_rescale=0.0,
        spatio_temporal_guidance_blocks=None, use_cross_timestep=True, max_sequence_length=SEQ,
        output_type="latent", return_dict=False,
    )
    return from_pipeline_space(pipe, video, audio)


def load_lora(pipe, folder):
    pipe.load_lora_weights(folder)


CASE = AdapterCase(
    adapter="LTX2Pipeline", tiny="ltx2", height=HEIGHT, width=WIDTH, num_frames=FRAMES, fps=24.0, steps=4, guidance=3.0,
    model_options={"max_sequence_length": SEQ}, pipeline=pipeline, pipeline_latents=pipeline_latents,
    load_lora=load_lora,
)


class TestLTX2(DiffusionAdapterSuite):
    case = CASE


@pytest.fixture(scope="module")
def model():
    return build(CASE)


def test_layout(model):
    assert model.makes_audio and model.frame_stride == 8 and model.size_multiple == 32
    assert model.latent_shape(HEIGHT, WIDTH, FRAMES) == {"video": (8, 2, 1, 1), "audio": (2, 9, 2)}
    # 121 frames at 24 fps = 5.04 s of audio at 25 latents per second: round(126.04) = 126.
    assert model.latent_shape(64, 96, 121) == {"video": (8, 16, 2, 3), "audio": (2, 126, 2)}
    cond = model.encode_prompts(["a red cube", "a very small green sphere on a long wooden table"], "blurry")
    assert cond["prompt_embeds"].shape == cond["negative_prompt_embeds"].shape == (2, SEQ, 16)
    assert cond["audio_prompt_embeds"].shape == (2, SEQ, 8)
    assert list(model.trainable_modules()) == ["transformer"]
    assert any("lora" in n for n, _ in model.transformer.named_parameters())
    assert not [p for m in model.frozen_modules() for p in m.parameters() if p.requires_grad]


def test_the_schedule_is_the_pipelines(model):
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

    # 2 video tokens at 32x32 px, 9 frames; 16 * 2 * 3 = 96 at 64x96, 121 frames: mu grows with them.
    assert model.schedule_mu(HEIGHT, WIDTH, FRAMES) == pytest.approx(calculate_shift(2, 1024, 4096, 0.95, 2.05))
    assert model.schedule_mu(64, 96, 121) > model.schedule_mu(HEIGHT, WIDTH, FRAMES)
    pipe = pipeline(model, False)
    pipe(prompt="x", height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=5, guidance_scale=1.0,
         audio_guidance_scale=1.0, stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0,
         spatio_temporal_guidance_blocks=None, max_sequence_length=SEQ, output_type="latent")
    torch.testing.assert_close(model.sigmas(5, HEIGHT, WIDTH, FRAMES), pipe.scheduler.sigmas.float(), atol=0, rtol=0)
    with pytest.raises(ValueError, match="video token count"):
        model.sigmas(5)


def test_bad_frame_counts_and_sizes_name_the_valid_values(model):
    with pytest.raises(ValueError, match=r"num_frames=10: expected 8k\+1 .* 9 or 17"):
        model.latent_shape(HEIGHT, WIDTH, 10)
    with pytest.raises(ValueError, match=r"num_frames=0: expected 8k\+1"):
        model.latent_shape(HEIGHT, WIDTH, 0)
    with pytest.raises(ValueError, match=r"height=40: expected a multiple of 32 .* 32 or 64"):
        model.latent_shape(40, WIDTH, FRAMES)
    with pytest.raises(ValueError, match=r"width=16: expected a multiple of 32 .* 32"):
        model.latent_shape(HEIGHT, 16, FRAMES)


def zeros(model, step: float = 0.0) -> ls.LatentStreams:
    shape = model.latent_shape(HEIGHT, WIDTH, FRAMES)
    return ls.LatentStreams({k: torch.full((1, *s), step) for k, s in shape.items()})


def test_the_video_decoder_responds_to_the_latents(model):
    video = model.decode(zeros(model))
    assert video.dtype == torch.uint8 and video.shape == (1, FRAMES, HEIGHT, WIDTH, 3)
    brightness = [float(model.decode(zeros(model, step)).float().mean()) / 255 for step in (-0.5, 0.0, 0.5)]
    # Measured: 0.43, 0.50, 0.75.
    assert brightness[2] - brightness[1] >= 0.05 and brightness[1] - brightness[0] >= 0.05, brightness


def test_decode_audio_shape_rate_and_response(model):
    wave, rate = model.decode_audio(zeros(model))
    # 9 latent frames -> 4 * 9 - 3 = 33 mel frames (causal) x 160 samples at 16 kHz, doubled by the BWE.
    assert rate == 32000 == model.vocoder.config.output_sampling_rate
    assert wave.dtype == torch.float32 and wave.shape == (1, 2, 33 * 160 * 2)
    assert wave.abs().max() <= 1.0
    means = [float(model.decode_audio(zeros(model, step))[0].mean()) for step in (-0.5, 0.0, 0.5)]
    # Measured: -0.26, 0.00, 0.63 (the waveform is an increasing function of the latent).
    assert means[2] - means[1] >= 0.1 and means[1] - means[0] >= 0.1, means
    rms = [float(model.decode_audio(zeros(model, step))[0].pow(2).mean().sqrt()) for step in (0.0, 0.5)]
    assert rms[1] - rms[0] >= 0.1, rms


def test_each_stream_moves_only_with_its_own_latent_in_decoding(model):
    base = zeros(model)
    louder = ls.LatentStreams({"video": base["video"], "audio": base["audio"] + 0.5})
    assert torch.equal(model.decode(louder), model.decode(base))
    assert not torch.allclose(model.decode_audio(louder)[0], model.decode_audio(base)[0])


def test_guided_velocity_is_plain_cfg_of_the_two_passes(model):
    """x0-space CFG (the pipeline's form) equals v_u + g (v_c - v_u) in velocity space."""
    shape = model.latent_shape(HEIGHT, WIDTH, FRAMES)
    x = ls.stack([ls.randn(shape, torch.Generator().manual_seed(s)) for s in range(2)])
    sigma = torch.tensor([0.9, 0.2])
    cond = model.encode_prompts(["a cat", "rain on a tin roof"], "noise")
    neg = type(cond)({k: cond[("negative_" + k) if not k.startswith("negative_") else k] for k in cond.tensors})
    with torch.no_grad():
        guided = model.predict_velocity(x, sigma, cond, 4.0)
        v_c = model.predict_velocity(x, sigma, cond, 1.0)
        v_u = model.predict_velocity(x, sigma, neg, 1.0)
    for name in ("video", "audio"):
        torch.testing.assert_close(guided[name], v_u[name] + 4.0 * (v_c[name] - v_u[name]), atol=1e-5, rtol=1e-5)
        assert (v_c[name] - v_u[name]).abs().max() > 1e-4  # the prompt matters to both streams

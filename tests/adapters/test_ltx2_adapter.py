"""The LTX-2 adapter (`LTX2Pipeline`) on `tiny:ltx2`: the shared diffusion adapter suite (video
and audio streams, tests/adapters/diffusion_suite.py), then its geometry errors, the schedule,
responsive video and audio decoders, decode_audio's shape and rate, and the pipeline's optional
guidance terms (STG, modality isolation, per-stream rescale) against the pipeline itself."""
import copy

import pytest
import torch
from diffusers import LTX2Pipeline

from omni_rl.algos import latent_streams as ls
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.data.diffusion_batch import DiffusionBatch
from omni_rl.families.diffusion import DiffusionFamily
from tests.adapters.diffusion_suite import (
    PROMPTS, AdapterCase, DiffusionAdapterSuite, assert_alone_equals_packed_across_the_schedule, assert_latents_close,
    build, fresh_pipeline, generate, initial_noise, max_change, ode, one, request,
)

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


# Plain CFG on both streams: the pipeline's STG, modality guidance and rescale pinned off.
PLAIN = dict(stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0, guidance_rescale=0.0,
             audio_guidance_rescale=0.0, spatio_temporal_guidance_blocks=None)


def pipeline_latents(pipe, prompt, latents, steps, guidance, case, **options):
    """The pipeline's sample from the adapter-space `latents`; `options` are its guidance
    arguments (default: plain CFG at `guidance` on both streams)."""
    video, audio = to_pipeline_space(pipe, latents)
    options = {"audio_guidance_scale": guidance, **PLAIN, **options}
    video, audio = pipe(
        prompt=prompt, latents=video, audio_latents=audio, height=case.height, width=case.width,
        num_frames=case.num_frames, frame_rate=24.0, num_inference_steps=steps, guidance_scale=guidance,
        use_cross_timestep=True, max_sequence_length=SEQ, output_type="latent", return_dict=False, **options,
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
    with pytest.raises(ValueError, match="shifts with the output.s sequence length"):
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


# --- the optional guidance terms --------------------------------------------------------------
RECIPE = "recipe=tiny_ltx2_flowgrpo_av"
# ModelConfig keys of each case; the tiny transformer has 2 blocks.
GUIDANCE = {
    "stg": dict(stg_scale=1.0, stg_blocks=[1]),
    "modality": dict(modality_scale=3.0),
    "all": dict(stg_scale=1.0, audio_stg_scale=0.5, stg_blocks=[0, 1], modality_scale=3.0, audio_modality_scale=2.0,
                audio_guidance_scale=5.0, guidance_rescale=0.7, audio_guidance_rescale=0.3),
}


def pipeline_options(model) -> dict:
    """The pipeline's guidance arguments for the adapter's terms (every audio value explicit)."""
    terms = model.guidance(CASE.guidance)
    video, audio = terms["video"], terms["audio"]
    return dict(
        audio_guidance_scale=audio.cfg, stg_scale=video.stg, audio_stg_scale=audio.stg,
        spatio_temporal_guidance_blocks=list(model.options.stg_blocks) or None, modality_scale=video.modality,
        audio_modality_scale=audio.modality, guidance_rescale=video.rescale, audio_guidance_rescale=audio.rescale,
    )


@pytest.fixture(scope="module", params=list(GUIDANCE))
def guided(request):
    return build(CASE, **GUIDANCE[request.param])


def test_guidance_terms_equal_the_pipeline_and_change_the_sample(guided, model):
    noise = initial_noise(guided, CASE, seed=7)
    (ours,), _ = generate(guided, [ode(CASE, PROMPTS[1], noise)], max_num_seqs=1)
    theirs = pipeline_latents(pipeline(guided, False), PROMPTS[1], one(noise), CASE.steps, CASE.guidance, CASE,
                              **pipeline_options(guided))
    assert_latents_close(ours.final_latent, ls.to(ls.index(theirs, 0), dtype=torch.float32), atol=1e-5)
    (plain,), _ = generate(model, [ode(CASE, PROMPTS[1], noise)], max_num_seqs=1)
    assert max_change(ours.final_latent, plain.final_latent) > 1e-3  # every stream moved away from plain CFG


def test_guided_samples_are_the_same_alone_and_in_a_forward_across_the_schedule(guided):
    """Equal to fp32 rounding: a forward's outputs move ~1e-6 with its batch size, and the guided
    velocity adds up to four x0 estimates scaled by their weights and divides by sigma (0.1 last):
    measured 1.2e-5 at most (modality), against plain CFG's 7e-6 at the same sigma."""
    assert_alone_equals_packed_across_the_schedule(guided, CASE, atol=3e-5)


def test_the_trainer_replays_guided_rollout_log_probs(guided):
    """Rollout and training guide through the same `predict_velocity`: the replay's log-probs are the rollout's."""
    cfg = load_config([RECIPE, "rollout.sampling_options.sde_window_range=null"])
    results, _ = generate(guided, [request(CASE, p, seed=i) for i, p in enumerate(PROMPTS)], max_num_seqs=3)
    batch = DiffusionBatch.from_results(results, [{}] * len(results), [0] * len(results))
    policy = DiffusionFamily(cfg, guided).behaviour_policy(batch, micro_batch_size=2)
    torch.testing.assert_close(policy.log_probs, batch.rollout_log_probs, atol=1e-5, rtol=0)


def test_audio_guidance_values_fall_back_to_the_video_ones():
    cfg = build(CASE, stg_scale=1.5, stg_blocks=[0], modality_scale=2.0, guidance_rescale=0.5).guidance(3.0)
    assert cfg["audio"] == cfg["video"] and cfg["video"].stg == 1.5 and cfg["video"].modality == 2.0
    assert build(CASE).guidance(3.0)["video"] == type(cfg["video"])(cfg=3.0)  # every term off by default


@pytest.mark.parametrize("overrides, message", [
    (["model.adapter_options.stg_scale=1.0"], r"model.adapter_options.stg_blocks=\[\]: expected the block indices STG perturbs .*\[28\]"),
    (["model.adapter_options.audio_stg_scale=1.0"], r"model.adapter_options.stg_blocks=\[\]: expected"),
    (["model.adapter_options.stg_scale=-1.0", "model.adapter_options.stg_blocks=[1]"], r"model.adapter_options.stg_scale=-1.0: expected a finite value >= 0"),
    (["model.adapter_options.modality_scale=0.5"], r"model.adapter_options.modality_scale=0.5: expected a finite value >= 1"),
    (["model.adapter_options.audio_modality_scale=0.0"], r"model.adapter_options.audio_modality_scale=0.0: expected a finite value >= 1"),
    (["model.adapter_options.audio_guidance_rescale=-0.1"], r"model.adapter_options.audio_guidance_rescale=-0.1: expected a finite value >= 0"),
    (["model.adapter_options.stg_blocks=[-1]"], r"model.adapter_options.stg_blocks=\[-1\]: expected zero-based"),
])
def test_bad_guidance_keys_fail_at_config_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config([RECIPE, *overrides])
    load_config([RECIPE, "model.adapter_options.stg_scale=1.0", "model.adapter_options.stg_blocks=[1]", "model.adapter_options.modality_scale=3.0"])


def test_stg_needs_blocks_that_exist_and_can_be_perturbed(tmp_path):
    import json
    import shutil

    from omni_rl.models.loading import resolve_model_path

    with pytest.raises(ValueError, match=r"model.adapter_options.stg_blocks=\[2\]: \[2\] are not blocks of this transformer \(0 .. 1\)"):
        build(CASE, stg_scale=1.0, stg_blocks=[2])
    folder = tmp_path / "ltx2"
    shutil.copytree(resolve_model_path("tiny:ltx2"), folder)
    config = folder / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "perturbed_attn": False}))
    with pytest.raises(ValueError, match="perturbed_attn=false"):
        build(CASE, path=str(folder), stg_scale=1.0, stg_blocks=[1])
    build(CASE, path=str(folder), modality_scale=3.0)  # modality isolation needs no perturbed attention

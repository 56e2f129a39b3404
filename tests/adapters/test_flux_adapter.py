"""The FLUX.1 adapter (`FluxPipeline`) on `tiny:flux`: the shared diffusion adapter suite
(tests/adapters/diffusion_suite.py, at FLUX's default: the distilled guidance, no true CFG), then
what is particular to it: the guidance embedding (its value is the option's and it changes the
velocity), true CFG with a negative prompt as the pipeline's `true_cfg_scale`, packing and position
ids, the dynamic-shift schedule, what is refused at load, and the responsive decoder."""
import copy

import numpy as np
import pytest
import torch
from diffusers import FluxPipeline

from adapters.flux import image_ids, pack_latents, unpack_latents
from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from tests.adapters.diffusion_suite import (
    AdapterCase, DiffusionAdapterSuite, build, fresh_pipeline, generate, initial_noise, ode, one,
)

SEQ = 32  # T5 tokens (the tiny prompts are shorter)
HEIGHT = WIDTH = 32


def pipeline(model, fresh: bool):
    if fresh:
        return fresh_pipeline(FluxPipeline, model)
    pipe = FluxPipeline(**{**model.pipeline.components, "scheduler": copy.deepcopy(model.scheduler)})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_pipeline(pipe, prompt, latents, steps, case, true_cfg_scale=1.0, negative_prompt=None, guidance=None):
    """The pipeline's own loop from the adapter's latent [1, C, h, w] (packed as the pipeline packs it)."""
    b, c, h, w = latents.shape
    packed = pipe._pack_latents(latents, b, c, h, w)
    out = pipe(prompt=prompt, negative_prompt=negative_prompt, true_cfg_scale=true_cfg_scale,
               guidance_scale=case.model_options.get("guidance", 3.5) if guidance is None else guidance,
               height=case.height, width=case.width, num_inference_steps=steps, latents=packed,
               max_sequence_length=SEQ, output_type="latent").images
    return pipe._unpack_latents(out, case.height, case.width, pipe.vae_scale_factor)


def pipeline_latents(pipe, prompt, latents, steps, guidance, case):
    # The suite runs FLUX's default: no negative prompt, so no true CFG whatever the scale.
    return run_pipeline(pipe, prompt, latents, steps, case, true_cfg_scale=guidance)


def load_lora(pipe, folder):
    pipe.load_lora_weights(folder)


CASE = AdapterCase(
    adapter="FluxPipeline", tiny="flux", height=HEIGHT, width=WIDTH, steps=4, guidance=1.0,
    model_options={"max_sequence_length": SEQ}, pipeline=pipeline, pipeline_latents=pipeline_latents,
    load_lora=load_lora,
)


class TestFlux(DiffusionAdapterSuite):
    case = CASE


@pytest.fixture(scope="module")
def model():
    return build(CASE)


# --- guidance -------------------------------------------------------------------------------
def test_the_guidance_embedding_is_the_options_value_and_changes_the_output(model):
    """At `model.adapter_options.guidance=5` the rollout is the pipeline's at `guidance_scale=5` (and not at
    3.5): the embedding the transformer reads is the option's value, and it moves the sample."""
    five = build(CASE, guidance=5.0)
    assert five.options.guidance == 5.0 and model.options.guidance == 3.5
    noise = initial_noise(five, CASE, seed=2)
    (ours,), _ = generate(five, [ode(CASE, "a red cube", noise)], max_num_seqs=1)
    pipe = pipeline(five, False)
    at_five = run_pipeline(pipe, "a red cube", one(noise), CASE.steps, CASE, guidance=5.0)[0]
    at_default = run_pipeline(pipe, "a red cube", one(noise), CASE.steps, CASE, guidance=3.5)[0]
    torch.testing.assert_close(ours.final_latent, at_five, atol=1e-5, rtol=0)
    assert (at_five - at_default).abs().max() > 1e-3
    with torch.no_grad():
        cond = model.encode_prompts(["a red cube"])
        x, sigma = noise[None], torch.tensor([0.7])
        assert (five.predict_velocity(x, sigma, cond, 1.0) - model.predict_velocity(x, sigma, cond, 1.0)).abs().max() > 1e-3


def test_true_cfg_with_a_negative_prompt_is_the_pipelines_true_cfg_scale(model):
    noise = initial_noise(model, CASE, seed=4)
    req = ode(CASE, "a red cube", noise)
    req.guidance_scale, req.negative_prompt = 3.0, "blurry"
    (ours,), _ = generate(model, [req], max_num_seqs=1)
    pipe = pipeline(model, False)
    theirs = run_pipeline(pipe, "a red cube", one(noise), CASE.steps, CASE, true_cfg_scale=3.0, negative_prompt="blurry")
    torch.testing.assert_close(ours.final_latent, theirs[0], atol=1e-5, rtol=0)
    plain = run_pipeline(pipe, "a red cube", one(noise), CASE.steps, CASE)[0]
    assert (theirs[0] - plain).abs().max() > 1e-3  # true CFG changed the sample


@torch.no_grad()
def test_a_scale_above_one_without_a_negative_prompt_runs_no_cfg_and_packs_with_cfg_samples(model):
    """As the pipeline: `true_cfg_scale` > 1 without a negative prompt is the plain forward; a batch
    mixing samples with and without a negative prompt gives each its own guidance."""
    x = torch.randn(2, *model.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])
    plain = model.encode_prompts(["a red cube", "fog"])
    negative = model.encode_prompts(["a red cube", "fog"], negative_prompt="blurry")
    assert plain["has_negative"].tolist() == [0.0, 0.0] and negative["has_negative"].tolist() == [1.0, 1.0]
    torch.testing.assert_close(model.predict_velocity(x, sigma, plain, 4.0), model.predict_velocity(x, sigma, plain, 1.0),
                               atol=1e-6, rtol=0)
    guided = model.predict_velocity(x, sigma, negative, 4.0)
    assert (guided - model.predict_velocity(x, sigma, negative, 1.0)).abs().max() > 1e-3
    from omni_rl.models import Conditioning

    mixed = Conditioning.cat([negative.select([0]), plain.select([1])])
    both = model.predict_velocity(x, sigma, mixed, 4.0)
    torch.testing.assert_close(both[0], guided[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(both[1], model.predict_velocity(x[1:], sigma[1:], plain.select([1]), 1.0)[0],
                               atol=1e-5, rtol=0)


# --- prompts, packing and position ids ------------------------------------------------------
def test_embeddings_are_t5_at_the_fixed_length_and_clip_pooled(model):
    cond = model.encode_prompts(["fog", "a very small green sphere"])
    assert tuple(cond["prompt_embeds"].shape) == (2, SEQ, 32) and tuple(cond["pooled_prompt_embeds"].shape) == (2, 32)
    assert cond.masks == {}
    embeds, pooled, _ = model.pipeline.encode_prompt(prompt=["fog"], prompt_2=None, max_sequence_length=SEQ)
    torch.testing.assert_close(cond["prompt_embeds"][:1], embeds, atol=0, rtol=0)
    torch.testing.assert_close(cond["pooled_prompt_embeds"][:1], pooled, atol=0, rtol=0)


def test_packing_and_position_ids_are_the_pipelines():
    x = torch.randn(2, 16, 4, 6)
    packed = pack_latents(x)
    torch.testing.assert_close(packed, FluxPipeline._pack_latents(x, 2, 16, 4, 6), atol=0, rtol=0)
    torch.testing.assert_close(unpack_latents(packed, 4, 6), x, atol=0, rtol=0)
    torch.testing.assert_close(image_ids(4, 6), FluxPipeline._prepare_latent_image_ids(1, 2, 3, "cpu", torch.float32),
                               atol=0, rtol=0)
    assert image_ids(4, 6, first=1.0)[:, 0].eq(1).all()


def test_the_schedule_is_the_pipelines_dynamic_shift(model):
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

    for height, width, steps in ((32, 32, 4), (64, 48, 10)):
        tokens = (height // 16) * (width // 16)
        cfg = model.scheduler.config
        mu = calculate_shift(tokens, cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift)
        assert model.schedule_mu(height, width) == pytest.approx(mu)
        scheduler = copy.deepcopy(model.scheduler)
        retrieve_timesteps(scheduler, steps, "cpu", sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        torch.testing.assert_close(model.sigmas(steps, height, width), scheduler.sigmas.float(), atol=0, rtol=0)


# --- refused at load ------------------------------------------------------------------------
def test_sizes_the_model_cannot_take_raise_with_the_nearest_values(model):
    with pytest.raises(ValueError, match=r"rollout.sampling_options.height=40: expected a multiple of 16 .* 32 or 48"):
        model.latent_shape(40, 32)
    with pytest.raises(ValueError, match="num_frames=5"):
        model.latent_shape(32, 32, 5)
    assert model.latent_shape(48, 80) == (16, 6, 10)
    with pytest.raises(ConfigError, match="rollout.sampling_options.width=24: expected a multiple of 16 .*16 or 32"):
        load_config(["model.adapter=FluxPipeline", "model.path=tiny:flux", "rollout.sampling_options.width=24"])


@pytest.mark.parametrize("option, expected", [
    ("cfg_renorm=0.5", "model.adapter_options.cfg_renorm=0.5: model adapter FluxPipeline has no option 'cfg_renorm'"),
    ("guidance_scale_2=3.0", "has no option 'guidance_scale_2'"),
    ("guidance=-1.0", "model.adapter_options.guidance=-1.0: expected a finite number >= 0"),
    ("max_sequence_length=600", "model.adapter_options.max_sequence_length=600: FLUX's T5 takes at most 512"),
])
def test_a_guidance_option_flux_does_not_have_is_one_error_line(capsys, tmp_path, option, expected):
    code = main(["recipe=tiny_flux_flowgrpo", f"model.adapter_options.{option}", f"trainer.output_dir={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err


def test_an_edit_dataset_on_flux_is_one_error_line_naming_kontext(capsys, tmp_path):
    code = main(["recipe=tiny_flux_flowgrpo", "data.prompts=null", "data.prompt_file=recipes/prompts/tiny_edit.jsonl",
                 f"trainer.output_dir={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "carries a source image" in err[0] and "FluxKontextPipeline" in err[0], err


# --- decoding -------------------------------------------------------------------------------
def test_decode_gives_uint8_images_and_refuses_other_shapes(model):
    images = model.decode(torch.zeros(2, *model.latent_shape(HEIGHT, 48)))
    assert images.shape == (2, HEIGHT, 48, 3) and images.dtype == torch.uint8
    with pytest.raises(ValueError, match="B, C, h, w"):
        model.decode(torch.zeros(1, 16, 1, 4, 4))


def test_the_decoder_responds_to_the_latents(model):
    """A fixed latent step moves brightness by >= 0.05 (0..1 scale), monotonely; latent 0 is mid-grey."""
    shape = (1, *model.latent_shape(HEIGHT, WIDTH))
    brightness = [float(model.decode(torch.full(shape, v)).float().mean()) / 255 for v in (-0.5, 0.0, 0.5)]
    assert brightness[1] == pytest.approx(0.5, abs=0.01)
    assert brightness[2] - brightness[1] >= 0.05 and brightness[1] - brightness[0] >= 0.05
    z = torch.zeros(shape)
    z[..., :2, :2] = 1.0
    image = model.decode(z)[0].float() / 255
    assert image[:16, :16].mean() > image[16:, 16:].mean() + 0.2

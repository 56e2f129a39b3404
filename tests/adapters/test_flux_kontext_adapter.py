"""The FLUX.1-Kontext adapter (`FluxKontextPipeline`) on `tiny:flux_kontext`: the shared diffusion
adapter suite with a source image per prompt (tests/adapters/diffusion_suite.py), then what is
particular to it: the source image's tokens change the velocity, are appended after the noise
tokens with position ids whose first channel is 1, and are never noised; true CFG as the
pipeline's; the condition size; and what is refused at load."""
import copy
import hashlib

import numpy as np
import pytest
import torch
from diffusers import FluxKontextPipeline
from PIL import Image

from adapters.flux import image_ids
from omni_rl.cli import main
from omni_rl.data.prompt_item import PromptItem
from tests.adapters.diffusion_suite import (
    AdapterCase, DiffusionAdapterSuite, build, fresh_pipeline, generate, initial_noise, ode, one,
)

SEQ = 32
HEIGHT = WIDTH = 32


def source_image(prompt: str, size: int = HEIGHT) -> Image.Image:
    """A deterministic square picture per prompt: a two-colour gradient seeded by its text."""
    seed = int.from_bytes(hashlib.sha1(prompt.encode()).digest()[:4], "little")
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    t = np.linspace(0, 1, size)[:, None, None]
    pixels = (a * (1 - t) + b * t) * np.ones((1, size, 1))
    return Image.fromarray(pixels.astype(np.uint8))


def pipeline(model, fresh: bool):
    if fresh:
        return fresh_pipeline(FluxKontextPipeline, model)
    pipe = FluxKontextPipeline(**{**model.pipeline.components, "scheduler": copy.deepcopy(model.scheduler)})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_pipeline(pipe, prompt, latents, steps, case, true_cfg_scale=1.0, negative_prompt=None, image=None):
    """The pipeline's own loop from the adapter's latent, the source image given at the condition
    size, not resized to a Kontext resolution, at the requested output size (max_area)."""
    b, c, h, w = latents.shape
    packed = pipe._pack_latents(latents, b, c, h, w)
    out = pipe(image=case.source_image(prompt) if image is None else image, prompt=prompt,
               negative_prompt=negative_prompt, true_cfg_scale=true_cfg_scale,
               guidance_scale=case.model_options.get("guidance", 3.5), height=case.height, width=case.width,
               max_area=case.height * case.width, _auto_resize=False, num_inference_steps=steps, latents=packed,
               max_sequence_length=SEQ, output_type="latent").images
    return pipe._unpack_latents(out, case.height, case.width, pipe.vae_scale_factor)


def pipeline_latents(pipe, prompt, latents, steps, guidance, case):
    return run_pipeline(pipe, prompt, latents, steps, case, true_cfg_scale=guidance)


CASE = AdapterCase(
    adapter="FluxKontextPipeline", tiny="flux_kontext", height=HEIGHT, width=WIDTH, steps=4, guidance=1.0,
    model_options={"max_sequence_length": SEQ}, pipeline=pipeline, pipeline_latents=pipeline_latents,
    load_lora=lambda pipe, folder: pipe.load_lora_weights(folder), source_image=source_image,
)


class TestFluxKontext(DiffusionAdapterSuite):
    case = CASE


@pytest.fixture(scope="module")
def model():
    return build(CASE)


def encode(model, prompts, images, negative_prompt=""):
    groups = [model.condition_images([im], HEIGHT, WIDTH) for im in images]
    return model.encode_prompts(prompts, negative_prompt=negative_prompt, images=groups)


# --- the source image -----------------------------------------------------------------------
@torch.no_grad()
def test_the_source_tokens_change_the_output(model):
    x = torch.randn(1, *model.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.6])
    a = model.predict_velocity(x, sigma, encode(model, ["make it red"], [source_image("a")]), 1.0)
    b = model.predict_velocity(x, sigma, encode(model, ["make it red"], [source_image("b")]), 1.0)
    assert (a - b).abs().max() > 1e-3


def test_the_source_tokens_follow_the_noise_tokens_with_id_one_and_are_never_noised(model):
    """Every forward of a rollout gets the noise tokens (which change) then the source image's
    packed latent (the same at every step, whatever the sigma) with position ids (1, row, col);
    the engine carries the noise latent only."""
    seen = []
    hook = model.transformer.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append((kw["hidden_states"].detach().clone(), kw["img_ids"].detach().clone())),
        with_kwargs=True,
    )
    try:
        noise = initial_noise(model, CASE, seed=1)
        (result,), _ = generate(model, [ode(CASE, "make it red", noise, model)], max_num_seqs=1)
    finally:
        hook.remove()
    assert tuple(result.final_latent.shape) == model.latent_shape(HEIGHT, WIDTH)  # noise tokens only
    cond = encode(model, ["make it red"], [source_image("make it red")])
    source = cond["image_latents"][0]
    tokens = source.shape[0]
    assert len(seen) == CASE.steps
    for hidden, ids in seen:
        assert hidden.shape[1] == 2 * tokens  # 4 noise tokens, then 4 source tokens (32 px each)
        torch.testing.assert_close(hidden[0, tokens:].float(), source, atol=0, rtol=0)
        torch.testing.assert_close(ids[:tokens], image_ids(4, 4), atol=0, rtol=0)
        torch.testing.assert_close(ids[tokens:], image_ids(4, 4, first=1.0), atol=0, rtol=0)
    assert (seen[0][0][0, :tokens] - seen[-1][0][0, :tokens]).abs().max() > 1e-2  # the noise tokens moved


def test_the_source_latent_is_the_pipelines(model):
    pipe = pipeline(model, False)
    image = source_image("x")
    pixels = pipe.image_processor.preprocess(image, HEIGHT, WIDTH)
    theirs = pipe._pack_latents(pipe._encode_vae_image(pixels, generator=None), 1, 16, 4, 4)
    torch.testing.assert_close(encode(model, ["x"], [image])["image_latents"], theirs, atol=1e-6, rtol=0)


def test_true_cfg_with_a_negative_prompt_is_the_pipelines(model):
    noise = initial_noise(model, CASE, seed=4)
    req = ode(CASE, "make it red", noise, model)
    req.guidance_scale, req.negative_prompt = 3.0, "blurry"
    (ours,), _ = generate(model, [req], max_num_seqs=1)
    pipe = pipeline(model, False)
    theirs = run_pipeline(pipe, "make it red", one(noise), CASE.steps, CASE, true_cfg_scale=3.0, negative_prompt="blurry")
    torch.testing.assert_close(ours.final_latent, theirs[0], atol=1e-5, rtol=0)
    plain = run_pipeline(pipe, "make it red", one(noise), CASE.steps, CASE)[0]
    assert (theirs[0] - plain).abs().max() > 1e-3


def test_the_condition_is_encoded_at_the_option_size(model):
    big = build(CASE, condition_image_size=[48, 64])
    (image,) = big.condition_images([source_image("a", size=40)], HEIGHT, WIDTH)
    assert tuple(image.shape) == (48, 64, 3)
    cond = big.encode_prompts(["make it red"], images=[(image,)])
    assert cond["image_grid"].tolist() == [[3, 4]] and tuple(cond["image_latents"].shape) == (1, 12, 64)
    x = torch.randn(1, *big.latent_shape(HEIGHT, WIDTH))
    assert big.predict_velocity(x, torch.tensor([0.5]), cond, 1.0).shape == x.shape
    with pytest.raises(ValueError, match=r"model.adapter_options.condition_image_size\[1\]=40: expected a multiple of 16.*32 or 48"):
        build(CASE, condition_image_size=[32, 40]).condition_images([source_image("a")], HEIGHT, WIDTH)


# --- refused at load ------------------------------------------------------------------------
def test_the_prompt_kind_is_checked_against_the_adapter():
    from adapters.flux import FluxAdapter
    from adapters.flux_kontext import FluxKontextAdapter

    edit = PromptItem("make it red", media={"images": [source_image("a")]})
    text = PromptItem("a red cube")
    with pytest.raises(ValueError, match="prompt 2 \\('a red cube'\\) has no source image.*edits images"):
        FluxKontextAdapter.check_prompt_items([edit, text], "data.prompt_file='e.jsonl'", "FluxKontextPipeline")
    with pytest.raises(ValueError, match="carries a source image.*makes images from text.*FluxKontextPipeline"):
        FluxAdapter.check_prompt_items([text, edit], "data.prompt_file='e.jsonl'", "FluxPipeline")


def one_error_line(capsys, *args) -> str:
    code = main(list(args))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_text_prompts_on_kontext_are_one_error_line(capsys, tmp_path):
    line = one_error_line(capsys, "recipe=tiny_flux_flowgrpo", "model.adapter=FluxKontextPipeline",
                          "model.path=tiny:flux_kontext", f"trainer.output_dir={tmp_path}")
    assert "data.prompts: prompt 1 ('a cat') has no source image" in line and "FluxKontextPipeline edits images" in line


@pytest.mark.parametrize("override, expected", [
    ("rollout.sampling_options.width=40", "rollout.sampling_options.width=40: expected a multiple of 16"),
    ("model.adapter_options.condition_image_size=[32,40]", "model.adapter_options.condition_image_size[1]=40: expected a multiple of 16"),
    ("model.adapter_options.image_guidance_scale=1.5", "has no option 'image_guidance_scale'"),
])
def test_a_size_or_option_kontext_cannot_take_is_one_error_line(capsys, tmp_path, override, expected):
    line = one_error_line(capsys, "recipe=tiny_flux_kontext_flowgrpo", override, f"trainer.output_dir={tmp_path}")
    assert expected in line, line

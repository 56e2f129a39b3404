"""The Z-Image adapter (`ZImagePipeline`) on `tiny:z_image`: the shared diffusion adapter suite
(tests/adapters/diffusion_suite.py), then what is particular to it: Qwen3's second-to-last hidden
state on the chat template, each caption at its own length (the transformer's own caption
padding is not inert), the time convention and sign, the pipeline's CFG with its normalisation
and per-sample truncation (and none at all, Z-Image-Turbo's way), the schedule, size and
option errors at load, and the responsive decoder."""
import copy
import dataclasses

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

from adapters.tiny.z_image import QWEN3_CHAT_TEMPLATE
from adapters.z_image import guided
from omni_rl.compose import load_config
from omni_rl.models import Conditioning
from tests.adapters.diffusion_suite import (
    PROMPTS, AdapterCase, DiffusionAdapterSuite, assert_alone_equals_packed_across_the_schedule, build, fresh_pipeline,
    generate, initial_noise, ode, one,
)
from tests.omni_rl.test_cli_inputs import assert_one_error_line, main_error

SEQ = 64  # the chat-templated tiny prompts are shorter
HEIGHT = WIDTH = 32


def pipeline(model, fresh: bool):
    if fresh:
        return fresh_pipeline(ZImagePipeline, model)
    pipe = ZImagePipeline(**{**model.pipeline.components, "scheduler": copy.deepcopy(model.scheduler)})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_latents(pipe, prompt, latents, steps, guidance, case, **options):
    """The pipeline's own loop from the adapter's latent [1, 16, h, w]; its guidance_scale is ours - 1."""
    options = {**case.model_options, **options}
    return pipe(prompt=prompt, guidance_scale=guidance - 1.0, height=case.height, width=case.width,
                num_inference_steps=steps, latents=latents, max_sequence_length=options["max_sequence_length"],
                cfg_normalization=options.get("cfg_normalization", 0.0), cfg_truncation=options.get("cfg_truncation", 1.0),
                output_type="latent").images


def load_lora(pipe, folder):
    pipe.load_lora_weights(folder)


CASE = AdapterCase(
    adapter="ZImagePipeline", tiny="z_image", height=HEIGHT, width=WIDTH, steps=4, guidance=4.0,
    model_options={"max_sequence_length": SEQ}, pipeline=pipeline, pipeline_latents=pipeline_latents,
    load_lora=load_lora,
)


class TestZImage(DiffusionAdapterSuite):
    case = CASE


@pytest.fixture(scope="module")
def model():
    return build(CASE)


# --- prompts ----------------------------------------------------------------------------------
def test_the_embeddings_are_qwen3s_second_to_last_layer_at_the_prompts_tokens(model):
    """The chat template's text (no think block: the pipeline asks enable_thinking=True), and the
    hidden state after the last-but-one layer at its tokens only."""
    tokenizer = model.pipeline.tokenizer
    text = tokenizer.apply_chat_template([{"role": "user", "content": "fog"}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=True)
    assert text == "<|im_start|>user\nfog<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.chat_template == QWEN3_CHAT_TEMPLATE
    ids = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        hidden = model.text_encoder(**ids, output_hidden_states=True).hidden_states
    cond = model.encode_prompts(["fog"])
    assert cond["prompt_embeds"].shape == (1, ids.input_ids.shape[1], 32)
    torch.testing.assert_close(cond["prompt_embeds"][0], hidden[-2][0], atol=1e-6, rtol=0)
    assert (cond["prompt_embeds"][0] - hidden[-1][0]).abs().max() > 1e-3  # not the last layer


def test_embeddings_have_each_prompts_length_and_a_mask(model):
    cond = model.encode_prompts(["fog", "a very small green sphere"], negative_prompt="blurry")
    assert cond.masks == {"prompt_embeds": "prompt_embeds_mask", "negative_prompt_embeds": "negative_prompt_embeds_mask"}
    # "<|im_start|>user\n" (1 + 5) + the prompt's bytes + "<|im_end|>\n" (2) + "<|im_start|>assistant\n" (1 + 10)
    assert cond["prompt_embeds_mask"].sum(1).tolist() == [3 + 19, len("a very small green sphere") + 19]
    assert cond["prompt_embeds"][0, 22:].abs().max() == 0
    assert cond["negative_prompt_embeds_mask"].sum(1).tolist() == [len("blurry") + 19] * 2
    # The same rows as the pipeline's own list of embeddings.
    ours = model.pipeline.encode_prompt(["a very small green sphere"], device="cpu", do_classifier_free_guidance=False,
                                        max_sequence_length=SEQ)[0][0]
    torch.testing.assert_close(cond["prompt_embeds"][1, : ours.shape[0]], ours, atol=1e-6, rtol=0)


@torch.no_grad()
def test_text_padding_is_inert_and_each_caption_keeps_its_own_length(model):
    """Padding the batch's text (garbage under mask 0) leaves the velocity unchanged; handing the
    transformer the padded caption instead (what a batch-level padding would do) changes it: its
    own padding of a caption to 32 tokens is a learned token that attention reads."""
    cond = model.encode_prompts(["a red cube", "fog"])
    x = torch.randn(2, *model.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])
    base = model.predict_velocity(x, sigma, cond, CASE.guidance)
    padded = cond.pad_to(cond.sequence_length("prompt_embeds") + 9)
    garbage = dict(padded.tensors)
    for name, mask in padded.masks.items():
        noise = torch.randn(garbage[name].shape, generator=torch.Generator().manual_seed(1))
        garbage[name] = torch.where(garbage[mask][..., None].bool(), garbage[name], noise)
    torch.testing.assert_close(model.predict_velocity(x, sigma, Conditioning(garbage, padded.masks), CASE.guidance),
                               base, atol=1e-5, rtol=0)
    unmasked = dict(garbage)
    for mask in padded.masks.values():
        unmasked[mask] = torch.ones_like(unmasked[mask])
    moved = model.predict_velocity(x, sigma, Conditioning(unmasked, padded.masks), CASE.guidance)
    assert (moved - base).abs().max() > 1e-3


@torch.no_grad()
def test_the_velocity_is_minus_the_transformer_at_one_minus_sigma(model):
    cond = model.encode_prompts(["fog"])
    x = torch.randn(1, *model.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(2))
    caption = cond["prompt_embeds"][0, : int(cond["prompt_embeds_mask"].sum())]
    out = model.transformer([x[0].unsqueeze(1)], torch.tensor([0.25]), [caption], return_dict=False)[0][0]
    torch.testing.assert_close(model.predict_velocity(x, torch.tensor([0.75]), cond, 1.0), -out.squeeze(1)[None],
                               atol=1e-6, rtol=0)


# --- guidance ---------------------------------------------------------------------------------
def test_the_pipelines_cfg_by_hand():
    pos = torch.tensor([[3.0, 4.0], [1.0, 0.0]])  # sample norms 5 and 1
    neg = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    # scale 1: pos + (pos - neg) = (6, 8) (norm 10) and (1, -1) (norm sqrt 2)
    torch.testing.assert_close(guided(pos, neg, 1.0, 0.0), torch.tensor([[6.0, 8.0], [1.0, -1.0]]))
    # normalisation 1.5: sample 0 capped at 7.5 -> (4.5, 6); sample 1 (sqrt 2 <= 1.5) unchanged
    torch.testing.assert_close(guided(pos, neg, 1.0, 1.5), torch.tensor([[4.5, 6.0], [1.0, -1.0]]))


@pytest.mark.parametrize("guidance, options", [
    (1.0, {}),  # Z-Image-Turbo: no CFG (the pipeline's guidance_scale 0)
    (4.0, {"cfg_normalization": 1.0, "cfg_truncation": 0.6}),  # both refinements, truncation mid-schedule
])
def test_noise_zero_equals_the_pipeline_with_its_guidance_options(guidance, options):
    trial = build(CASE, **options)
    noise = initial_noise(trial, CASE, seed=7)
    request = dataclasses.replace(ode(CASE, PROMPTS[1], noise, trial), guidance_scale=guidance)
    (ours,), _ = generate(trial, [request], max_num_seqs=1)
    theirs = pipeline_latents(pipeline(trial, False), PROMPTS[1], one(noise), CASE.steps, guidance, CASE, **options)
    torch.testing.assert_close(ours.final_latent, theirs[0].float(), atol=CASE.atol, rtol=0)
    plain = pipeline_latents(pipeline(trial, False), PROMPTS[1], one(noise), CASE.steps, guidance, CASE)
    if options:  # the options changed the pipeline's output, so the match above is not vacuous
        assert (plain - theirs).abs().max() > 1e-4


@torch.no_grad()
def test_without_cfg_the_negative_prompt_is_not_read(model):
    x = torch.randn(1, *model.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(3))
    sigma = torch.tensor([0.7])
    a, b = model.encode_prompts(["fog"], negative_prompt=""), model.encode_prompts(["fog"], negative_prompt="blurry")
    torch.testing.assert_close(model.predict_velocity(x, sigma, a, 1.0), model.predict_velocity(x, sigma, b, 1.0),
                               atol=0, rtol=0)
    assert (model.predict_velocity(x, sigma, a, 4.0) - model.predict_velocity(x, sigma, b, 4.0)).abs().max() > 1e-4


def test_truncation_is_per_sample_in_a_packed_forward():
    """With cfg_truncation 0.5 an 8-step batch holds samples with and without CFG; each equals itself alone."""
    truncated = build(CASE, cfg_truncation=0.5)
    sigmas = truncated.sigmas(8, HEIGHT, WIDTH)[:-1]
    assert (1 - sigmas).max() > 0.5 > (1 - sigmas).min()
    assert_alone_equals_packed_across_the_schedule(truncated, CASE, atol=CASE.atol)


# --- schedule and sizes -----------------------------------------------------------------------
def test_the_schedule_is_the_pipelines(model):
    from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift, get_default_z_image_sigmas, retrieve_timesteps

    assert model.schedule_mu(HEIGHT, WIDTH) is None  # Turbo's static shift 3
    for steps in (4, 6):
        scheduler = copy.deepcopy(model.scheduler)
        retrieve_timesteps(scheduler, steps, "cpu", sigmas=get_default_z_image_sigmas(steps), mu=0.5)
        torch.testing.assert_close(model.sigmas(steps, HEIGHT, WIDTH), scheduler.sigmas.float(), atol=0, rtol=0)
    # A scheduler that shifts dynamically gets the pipeline's mu of the image token count.
    dynamic = copy.copy(model)
    dynamic.__dict__.pop("_sigma_cache", None)
    dynamic.scheduler = FlowMatchEulerDiscreteScheduler.from_config({**model.scheduler.config, "use_dynamic_shifting": True})
    cfg = dynamic.scheduler.config
    mu = calculate_shift((64 // 16) * (48 // 16), cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift,
                         cfg.max_shift)
    assert dynamic.schedule_mu(64, 48) == pytest.approx(mu)
    scheduler = copy.deepcopy(dynamic.scheduler)
    retrieve_timesteps(scheduler, 6, "cpu", sigmas=get_default_z_image_sigmas(6), mu=mu)
    torch.testing.assert_close(dynamic.sigmas(6, 64, 48), scheduler.sigmas.float(), atol=0, rtol=0)


def test_sizes_the_model_cannot_take_raise_with_the_nearest_values(model):
    with pytest.raises(ValueError, match=r"rollout.sampling_options.height=40: expected a multiple of 16 .* 32 or 48"):
        model.latent_shape(40, 32)
    with pytest.raises(ValueError, match="num_frames=5"):
        model.latent_shape(32, 32, 5)
    assert model.latent_shape(48, 80) == (16, 6, 10)
    # Past the rotary table: axes_lens 512 token rows of 16 px.
    with pytest.raises(ValueError, match="rollout.sampling_options.width=8208: past ZImagePipeline's rotary table.* largest valid value is 8192"):
        model.latent_shape(32, 8208)


# --- at load, before any weights ----------------------------------------------------------------
@pytest.fixture
def out(tmp_path):
    return f"trainer.output_dir={tmp_path / 'out'}"


@pytest.mark.parametrize("override, expected", [
    ("rollout.sampling_options.width=40", ("rollout.sampling_options.width=40: expected a multiple of 16", "32 or 48")),
    ("rollout.sampling_options.num_frames=5", ("rollout.sampling_options.num_frames=5", "expected 1")),
    ("model.adapter_options.guidance_scale_2=3.0", ("model.adapter_options.guidance_scale_2=3.0", "has no option 'guidance_scale_2'",
                                             "cfg_normalization, cfg_truncation, max_sequence_length")),
    ("model.adapter_options.cfg_normalization=1.0", ("model.adapter_options.cfg_normalization=1.0: refines CFG",
                                              "rollout.sampling_options.guidance_scale=1.0 runs none")),
    ("model.adapter_options.cfg_truncation=1.5", ("cfg_truncation=1.5: expected a value in [0, 1]",)),
    ("data.prompts=null data.prompt_file=recipes/prompts/tiny_edit.jsonl", ("prompt 1", "carries a source image",
                                                          "model.adapter=ZImagePipeline")),
])
def test_bad_input_is_one_error_line_at_load(capsys, out, override, expected):
    code, err = main_error(capsys, "recipe=tiny_z_image_flowgrpo", *override.split(), out)
    assert code == 2
    assert_one_error_line(err, *expected)


def test_sizes_past_the_rotary_table_are_refused_from_the_configs(model):
    """`check_model_limits` reads the folder's configs (no weights) before the model loads."""
    from adapters.z_image import ZImageAdapter
    from omni_rl.models.limits import ComponentConfigs
    from pathlib import Path

    configs = ComponentConfigs(Path(model.path))
    ZImageAdapter.check_model_limits(load_config(["recipe=tiny_z_image_flowgrpo"]), configs)
    cfg = load_config(["recipe=tiny_z_image_flowgrpo", "model.adapter_options.max_sequence_length=1600"])
    with pytest.raises(ValueError, match=r"max_sequence_length=1600: past ZImagePipeline's rotary table.* 1504$"):
        ZImageAdapter.check_model_limits(cfg, configs)
    cfg = load_config(["recipe=tiny_z_image_flowgrpo", "rollout.sampling_options.height=8224"])
    with pytest.raises(ValueError, match=r"rollout.sampling_options.height=8224: past .* largest valid value is 8192$"):
        ZImageAdapter.check_model_limits(cfg, configs)


# --- decoding ---------------------------------------------------------------------------------
def test_decode_gives_uint8_images_and_refuses_other_shapes(model):
    images = model.decode(torch.zeros(2, *model.latent_shape(HEIGHT, 48)))
    assert images.shape == (2, HEIGHT, 48, 3) and images.dtype == torch.uint8
    with pytest.raises(ValueError, match=r"\[B, C, h, w\]"):
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

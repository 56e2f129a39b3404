"""The FLUX.2 adapters on their tiny models: `Flux2KleinPipeline` on `tiny:flux2` and
`Flux2Pipeline` (FLUX.2 [dev]) on `tiny:flux2_dev`, each through the shared diffusion adapter
suite (tests/adapters/diffusion_suite.py; klein with CFG, the tiny model being a base
checkpoint, dev with its guidance embedding), then what is particular to them: the stacked
hidden states of each text encoder's template, the patchified batch-norm latent, position ids,
the empirical-mu schedule, the distilled checkpoints' refusal of guidance, dev's guidance
embedding, size errors and the responsive decoder."""
import copy
import json
import shutil

import numpy as np
import pytest
import torch
from diffusers import Flux2KleinPipeline

from adapters.flux2 import image_ids, patchify, text_ids, unpatchify
from omni_rl.cli import check_inputs, main
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.models.loading import resolve_model_path
from tests.adapters.diffusion_suite import AdapterCase, DiffusionAdapterSuite, build, fresh_pipeline

SEQ = 96  # text tokens (chat template included); the pipeline's default is 512
HEIGHT = WIDTH = 32


def pipeline(model, fresh: bool):
    cls = type(model.pipeline)
    if fresh:
        return fresh_pipeline(cls, model)
    extra = {"is_distilled": model.is_distilled} if cls is Flux2KleinPipeline else {}
    pipe = cls(**{**model.pipeline.components, "scheduler": copy.deepcopy(model.scheduler)}, **extra)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_latents(pipe, prompt, latents, steps, guidance, case):
    """The pipeline's own loop from the adapter's latent [1, 128, h, w] (the pipeline's noise
    layout). Its "latent" output is, for klein, the VAE's [1, 32, 2h, 2w] (normalised back here
    for comparison), for dev the denoised tokens [1, h w, 128] (unpacked here)."""
    out = pipe(prompt=prompt, guidance_scale=guidance, height=case.height, width=case.width,
               num_inference_steps=steps, latents=latents, max_sequence_length=case.model_options["max_sequence_length"],
               output_type="latent").images
    if out.ndim == 3:
        return out.transpose(1, 2).reshape(latents.shape)
    bn = pipe.vae.bn
    x = patchify(out)
    return (x - bn.running_mean.view(1, -1, 1, 1)) / torch.sqrt(bn.running_var.view(1, -1, 1, 1)
                                                                 + pipe.vae.config.batch_norm_eps)


def load_lora(pipe, folder):
    pipe.load_lora_weights(folder)


CASE = AdapterCase(
    adapter="Flux2KleinPipeline", tiny="flux2", height=HEIGHT, width=WIDTH, steps=4, guidance=4.0,
    model_options={"max_sequence_length": SEQ}, pipeline=pipeline, pipeline_latents=pipeline_latents,
    load_lora=load_lora,
)


class TestFlux2Klein(DiffusionAdapterSuite):
    case = CASE


# The dev pipeline's system message is ~210 byte tokens of the tiny tokenizer before the prompt.
DEV_SEQ = 288
DEV_CASE = AdapterCase(
    adapter="Flux2Pipeline", tiny="flux2_dev", height=HEIGHT, width=WIDTH, steps=4, guidance=4.0,
    model_options={"max_sequence_length": DEV_SEQ}, pipeline=pipeline, pipeline_latents=pipeline_latents,
    load_lora=load_lora,
)


class TestFlux2Dev(DiffusionAdapterSuite):
    case = DEV_CASE


@pytest.fixture(scope="module")
def model():
    return build(CASE)


@pytest.fixture(scope="module")
def distilled_folder(tmp_path_factory):
    """tiny:flux2 with model_index.json saying `is_distilled: true` (the klein-4B/9B checkpoints)."""
    folder = tmp_path_factory.mktemp("flux2_distilled") / "model"
    shutil.copytree(resolve_model_path("tiny:flux2"), folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    return folder


# --- prompts ----------------------------------------------------------------------------------
def test_the_embeddings_stack_the_chat_templates_hidden_states(model):
    """prompt_embeds[0, i] = hidden states 9, 18 and 27 of token i of the Qwen3 chat template
    (thinking off) padded to max_sequence_length, concatenated."""
    tokenizer = model.pipeline.tokenizer
    text = tokenizer.apply_chat_template([{"role": "user", "content": "fog"}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    assert text == "<|im_start|>user\nfog<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ids = tokenizer(text, return_tensors="pt", padding="max_length", max_length=SEQ)
    with torch.no_grad():
        hidden = model.text_encoder(**ids, output_hidden_states=True).hidden_states
    expected = torch.cat([hidden[9][0], hidden[18][0], hidden[27][0]], dim=-1)
    cond = model.encode_prompts(["fog"])
    assert cond["prompt_embeds"].shape == (1, SEQ, 48) and cond.masks == {}
    torch.testing.assert_close(cond["prompt_embeds"][0], expected, atol=1e-6, rtol=0)


def test_every_prompt_has_max_sequence_length_tokens_and_the_padding_is_read(model):
    short, long = model.encode_prompts(["fog", "a very small green sphere on a long wooden table"])["prompt_embeds"]
    assert short.shape == long.shape == (SEQ, 48)
    # The padding's hidden states are not zero: the transformer attends to them, as in the pipeline.
    assert short[-1].abs().max() > 1e-3


def test_the_negative_prompt_is_encoded_for_cfg_and_not_for_a_distilled_checkpoint(model, distilled_folder):
    cond = model.encode_prompts(["fog", "a red cube"], negative_prompt="")
    torch.testing.assert_close(cond["negative_prompt_embeds"][0], model.encode_prompts([""])["prompt_embeds"][0])
    distilled = build(CASE, path=str(distilled_folder))
    assert distilled.is_distilled
    assert set(distilled.encode_prompts(["fog"]).tensors) == {"prompt_embeds"}


# --- guidance ---------------------------------------------------------------------------------
@torch.no_grad()
def test_cfg_is_the_pipelines_combination_of_two_forwards(model):
    cond = model.encode_prompts(["a red cube", "fog"])
    x = torch.randn(2, *model.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])
    positive = model.predict_velocity(x, sigma, cond, 1.0)
    negative = model.predict_velocity(x, sigma, type(cond)({"prompt_embeds": cond["negative_prompt_embeds"]}), 1.0)
    guided = model.predict_velocity(x, sigma, cond, 4.0)
    torch.testing.assert_close(guided, negative + 4.0 * (positive - negative), atol=1e-5, rtol=0)
    assert (guided - positive).abs().max() > 1e-3


@torch.no_grad()
def test_a_distilled_checkpoint_ignores_the_scale_as_the_pipeline_does(model, distilled_folder):
    distilled = build(CASE, path=str(distilled_folder))
    cond = distilled.encode_prompts(["fog"])
    x = torch.randn(1, *distilled.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.7])
    torch.testing.assert_close(distilled.predict_velocity(x, sigma, cond, 4.0),
                               distilled.predict_velocity(x, sigma, cond, 1.0), atol=0, rtol=0)
    # The option overrides the checkpoint's flag, as the pipeline's is_distilled argument does.
    assert not build(CASE, path=str(distilled_folder), is_distilled=False).is_distilled


def test_a_guidance_scale_on_a_distilled_checkpoint_is_one_error_line_before_loading(distilled_folder, tmp_path,
                                                                                     capsys):
    """Read from model_index.json (the command line's `check_inputs`, before any weights)."""
    base = ["model.adapter=Flux2KleinPipeline", f"model.path={distilled_folder}", "rollout.sampling_options.height=32",
            "rollout.sampling_options.width=32", f"trainer.output_dir={tmp_path / 'out'}"]
    assert main([*base, "rollout.sampling_options.guidance_scale=4.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: rollout.sampling_options.guidance_scale=4: Flux2KleinPipeline on a step-distilled checkpoint (is_distilled) "
                   "takes no guidance; set rollout.sampling_options.guidance_scale=1, or use a -base checkpoint for CFG"]
    check_inputs(load_config([*base, "rollout.sampling_options.guidance_scale=1.0"]))
    check_inputs(load_config([*base, "rollout.sampling_options.guidance_scale=4.0", "model.adapter_options.is_distilled=false"]))
    assert not (tmp_path / "out").exists()


def test_an_option_flux2_klein_does_not_have_is_refused_at_load():
    with pytest.raises(ConfigError, match="model.adapter_options.true_cfg_scale"):
        load_config(["model.adapter=Flux2KleinPipeline", "model.path=tiny:flux2", "model.adapter_options.true_cfg_scale=4"])
    with pytest.raises(ConfigError, match="text_encoder_out_layers"):
        load_config(["model.adapter=Flux2KleinPipeline", "model.path=tiny:flux2",
                     "model.adapter_options.text_encoder_out_layers=[]"])


def test_layers_that_do_not_give_the_transformers_width_are_refused(model):
    with pytest.raises(ValueError, match=r"text_encoder_out_layers=\[9, 18\]: 2 layers x hidden size 16 = 32, but "
                                         r"the transformer takes 48; use 3 layers"):
        build(CASE, text_encoder_out_layers=[9, 18])


# --- latents and positions --------------------------------------------------------------------
def test_patchify_is_the_pipelines_and_inverts():
    z = torch.randn(2, 32, 4, 6)
    x = patchify(z)
    torch.testing.assert_close(x, Flux2KleinPipeline._patchify_latents(z), atol=0, rtol=0)
    torch.testing.assert_close(unpatchify(x), z, atol=0, rtol=0)
    torch.testing.assert_close(unpatchify(x), Flux2KleinPipeline._unpatchify_latents(x), atol=0, rtol=0)


def test_position_ids_are_the_pipelines():
    x = torch.zeros(1, 128, 3, 5)
    torch.testing.assert_close(image_ids(3, 5), Flux2KleinPipeline._prepare_latent_ids(x)[0], atol=0, rtol=0)
    assert image_ids(3, 5)[7].tolist() == [0, 1, 2, 0]  # token 7 = row 1, column 2
    torch.testing.assert_close(text_ids(6), Flux2KleinPipeline._prepare_text_ids(torch.zeros(1, 6, 8))[0], atol=0,
                               rtol=0)


def test_the_latent_round_trips_through_the_vae_normalisation(model):
    x = torch.randn(2, *model.latent_shape(HEIGHT, 48), generator=torch.Generator().manual_seed(2))
    raw = model.raw_latents(x)
    assert raw.shape == (2, 32, 4, 6)
    torch.testing.assert_close(model.normalised_latents(raw), x, atol=1e-5, rtol=0)


# --- schedule and sizes -----------------------------------------------------------------------
def test_the_schedule_is_the_pipelines_empirical_mu(model):
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu, retrieve_timesteps

    for height, width, steps in ((32, 32, 4), (64, 48, 10), (1024, 1024, 4)):
        mu = compute_empirical_mu(image_seq_len=(height // 16) * (width // 16), num_steps=steps)
        assert model.schedule_mu(height, width, num_steps=steps) == pytest.approx(mu)
        scheduler = copy.deepcopy(model.scheduler)
        retrieve_timesteps(scheduler, steps, "cpu", sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        torch.testing.assert_close(model.sigmas(steps, height, width), scheduler.sigmas.float(), atol=0, rtol=0)
    # mu depends on the step count, not on the size alone.
    assert model.schedule_mu(32, 32, num_steps=4) != model.schedule_mu(32, 32, num_steps=28)
    with pytest.raises(ValueError, match="pass height and width"):
        model.sigmas(4)


def test_sizes_the_vae_cannot_take_raise_with_the_nearest_values(model):
    with pytest.raises(ValueError, match=r"rollout.sampling_options.height=40: expected a multiple of 16 .* 32 or 48"):
        model.latent_shape(40, 32)
    with pytest.raises(ValueError, match="num_frames=5"):
        model.latent_shape(32, 32, 5)
    assert model.latent_shape(48, 80) == (128, 3, 5)
    # At config load, before any weights (`size_multiple`).
    with pytest.raises(ConfigError, match=r"rollout.sampling_options.width=24: expected a multiple of 16 .* e.g. 16 or 32"):
        load_config(["model.adapter=Flux2KleinPipeline", "model.path=tiny:flux2", "rollout.sampling_options.width=24"])


# --- decoding ---------------------------------------------------------------------------------
def test_decode_gives_uint8_images_and_refuses_other_shapes(model):
    images = model.decode(torch.zeros(2, *model.latent_shape(HEIGHT, 48)))
    assert images.shape == (2, HEIGHT, 48, 3) and images.dtype == torch.uint8
    with pytest.raises(ValueError, match=r"\[B, C, h, w\]"):
        model.decode(torch.zeros(1, 128, 1, 2, 2))


def test_the_decoder_responds_to_the_latents(model):
    """A fixed latent step moves brightness by >= 0.05 (0..1 scale), monotonely; latent 0 is mid-grey."""
    shape = (1, *model.latent_shape(HEIGHT, WIDTH))
    brightness = [float(model.decode(torch.full(shape, v)).float().mean()) / 255 for v in (-0.5, 0.0, 0.5)]
    assert brightness[1] == pytest.approx(0.5, abs=0.01)
    assert brightness[2] - brightness[1] >= 0.05 and brightness[1] - brightness[0] >= 0.05
    # Local: a brighter latent token (a 16x16 px patch) brightens its pixels.
    z = torch.zeros(shape)
    z[..., :1, :1] = 1.0
    image = model.decode(z)[0].float() / 255
    assert image[:16, :16].mean() > image[16:, 16:].mean() + 0.1


# --- FLUX.2 [dev] -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dev_model():
    return build(DEV_CASE)


def test_dev_embeddings_stack_mistral_hidden_states_of_the_system_prompt_template(dev_model):
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input

    processor = dev_model.pipeline.tokenizer
    inputs = processor.apply_chat_template(format_input(["fog"], dev_model.pipeline.system_message), tokenize=True,
                                           return_dict=True, return_tensors="pt", padding="max_length",
                                           truncation=True, max_length=DEV_SEQ)
    text = processor.tokenizer.decode(inputs["input_ids"][0][inputs["attention_mask"][0].bool()])
    assert text.startswith("[SYSTEM_PROMPT]You are an AI that reasons") and text.endswith("[INST]fog[/INST]")
    with torch.no_grad():
        hidden = dev_model.text_encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                        output_hidden_states=True).hidden_states
    expected = torch.cat([hidden[10][0], hidden[20][0], hidden[30][0]], dim=-1)
    cond = dev_model.encode_prompts(["fog"], negative_prompt="blurry")
    assert set(cond.tensors) == {"prompt_embeds"}  # no CFG, so no negative prompt
    torch.testing.assert_close(cond["prompt_embeds"][0], expected, atol=1e-6, rtol=0)


@torch.no_grad()
def test_dev_guidance_goes_into_the_embedding_in_one_forward(dev_model):
    cond = dev_model.encode_prompts(["a red cube", "fog"])
    x = torch.randn(2, *dev_model.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])
    direct = dev_model.transformer(
        hidden_states=x.flatten(2).transpose(1, 2), encoder_hidden_states=cond["prompt_embeds"], timestep=sigma,
        img_ids=image_ids(2, 2), txt_ids=text_ids(DEV_SEQ), guidance=torch.full((2,), 2.5), return_dict=False,
    )[0]
    torch.testing.assert_close(dev_model.predict_velocity(x, sigma, cond, 2.5), direct.transpose(1, 2).reshape(x.shape),
                               atol=1e-6, rtol=0)
    assert (dev_model.predict_velocity(x, sigma, cond, 4.0) - dev_model.predict_velocity(x, sigma, cond, 1.0)).abs().max() > 1e-3


def test_dev_refuses_the_klein_only_option_and_a_klein_checkpoint():
    with pytest.raises(ConfigError, match="model.adapter_options.is_distilled"):
        load_config(["model.adapter=Flux2Pipeline", "model.path=tiny:flux2_dev", "model.adapter_options.is_distilled=true"])
    with pytest.raises(ValueError, match=r"no guidance embedding \(guidance_embeds: false\); a klein checkpoint "
                                         r"loads with model.adapter=Flux2KleinPipeline"):
        build(DEV_CASE, path=resolve_model_path("tiny:flux2"))

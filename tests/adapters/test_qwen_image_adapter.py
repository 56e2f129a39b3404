"""The Qwen-Image adapter (`QwenImagePipeline`) on `tiny:qwen_image`: the shared diffusion adapter
suite (tests/adapters/diffusion_suite.py), then what is particular to it: the prompt template's
prefix count, embeddings of variable length whose padding is inert, true CFG with norm, the
dynamic-shift schedule, size errors and the responsive decoder."""
import copy

import numpy as np
import pytest
import torch
from diffusers import QwenImagePipeline

from adapters.qwen_image import pack_latents, prompt_prefix_length, true_cfg_with_norm, unpack_latents
from omni_rl.compose import load_config
from omni_rl.models import Conditioning
from omni_rl.errors import ConfigError
from tests.adapters.diffusion_suite import AdapterCase, DiffusionAdapterSuite, build, fresh_pipeline

SEQ = 64  # text tokens kept after the template's prefix (the tiny prompts are shorter)
HEIGHT = WIDTH = 32


def pipeline(model, fresh: bool):
    if fresh:
        pipe = fresh_pipeline(QwenImagePipeline, model)
    else:
        pipe = QwenImagePipeline(**{**model.pipeline.components, "scheduler": copy.deepcopy(model.scheduler)})
        pipe.set_progress_bar_config(disable=True)
    # The pipeline's fixed 34 is the real tokenizer's count; the tiny one's is computed.
    pipe.prompt_template_encode_start_idx = model.prompt_prefix_length
    return pipe


def pipeline_latents(pipe, prompt, latents, steps, guidance, case):
    """The pipeline's own loop from the adapter's latent [1, C, 1, h, w] (packed as the pipeline packs it)."""
    b, c, _, h, w = latents.shape
    packed = pipe._pack_latents(latents, b, c, h, w)
    out = pipe(prompt=prompt, negative_prompt="", true_cfg_scale=guidance, height=case.height, width=case.width,
               num_inference_steps=steps, latents=packed, max_sequence_length=SEQ, output_type="latent").images
    return pipe._unpack_latents(out, case.height, case.width, pipe.vae_scale_factor)


def load_lora(pipe, folder):
    pipe.load_lora_weights(folder)


CASE = AdapterCase(
    adapter="QwenImagePipeline", tiny="qwen_image", height=HEIGHT, width=WIDTH, steps=4, guidance=4.0,
    model_options={"max_sequence_length": SEQ}, pipeline=pipeline, pipeline_latents=pipeline_latents,
    load_lora=load_lora,
)


class TestQwenImage(DiffusionAdapterSuite):
    case = CASE


@pytest.fixture(scope="module")
def model():
    return build(CASE)


# --- prompts ----------------------------------------------------------------------------------
def test_the_prefix_count_is_the_tiny_tokenizers_own(model):
    # The tiny tokenizer has one token per byte plus one per special token, so the prefix
    # "<|im_start|>system\n<system prompt><|im_end|>\n<|im_start|>user\n" counts
    # 3 special tokens + the bytes of everything else.
    prefix = model.pipeline.prompt_template_encode.split("{}")[0]
    specials = ("<|im_start|>", "<|im_end|>")
    plain = prefix
    for token in specials:
        plain = plain.replace(token, "")
    assert model.prompt_prefix_length == 3 + len(plain.encode()) == 149
    assert model.pipeline.prompt_template_encode_start_idx == 149  # not the pipeline's 34


def test_the_embeddings_start_at_the_prompt(model):
    """The embedding's first row is the encoder's state at the prompt's first token."""
    pipe = model.pipeline
    text = pipe.prompt_template_encode.format("fog")
    ids = pipe.tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        hidden = model.text_encoder(**ids, output_hidden_states=True).hidden_states[-1][0]
    cond = model.encode_prompts(["fog"])
    first = ids.input_ids[0, model.prompt_prefix_length]
    assert pipe.tokenizer.decode([first]) == "f"
    torch.testing.assert_close(cond["prompt_embeds"][0], hidden[model.prompt_prefix_length :], atol=1e-6, rtol=0)


def test_two_prompts_give_different_embeddings(model):
    a, b = model.encode_prompts(["a red cube", "a blue ball"]).select([0]), model.encode_prompts(["a blue ball"])
    assert a["prompt_embeds"].shape == b["prompt_embeds"].shape
    assert (a["prompt_embeds"] - b["prompt_embeds"]).abs().max() > 1e-2
    # What the pipeline's fixed 34 does with this tokenizer: the kept tokens are the template's
    # system prompt, the same for every prompt.
    pipe = copy.copy(model.pipeline)
    pipe.prompt_template_encode_start_idx = 34
    fixed = [pipe.encode_prompt(prompt=[p], device="cpu", max_sequence_length=SEQ)[0] for p in ("a red cube", "a blue ball")]
    # The same tokens at the same places, but in sequences of 10 and 11 bytes' tokens: the matrix
    # products have other shapes, which BLAS may round otherwise (by CPU), so float32's tolerance.
    torch.testing.assert_close(fixed[0], fixed[1])


def test_the_prefix_count_refuses_a_template_without_one_slot(model):
    with pytest.raises(ValueError, match="exactly one"):
        prompt_prefix_length(model.pipeline.tokenizer, "no slot here")


def test_embeddings_have_each_prompts_length_and_a_mask(model):
    cond = model.encode_prompts(["fog", "a very small green sphere"], negative_prompt="blurry")
    assert cond.masks == {"prompt_embeds": "prompt_embeds_mask", "negative_prompt_embeds": "negative_prompt_embeds_mask"}
    mask = cond["prompt_embeds_mask"]
    # "fog" + "<|im_end|>\n<|im_start|>assistant\n": 3 + 2 + 1 + 10 = 16 tokens; the longer prompt sets L.
    assert mask.sum(1).tolist() == [16, len("a very small green sphere") + 13]
    assert cond["prompt_embeds"][0, 16:].abs().max() == 0
    assert cond["negative_prompt_embeds_mask"].sum(1).tolist() == [len("blurry") + 13] * 2


@torch.no_grad()
def test_text_padding_is_inert_and_the_mask_is_used(model):
    """Padding the text (even with garbage under mask 0) leaves the velocity unchanged; the same
    garbage unmasked changes it, so the transformer really reads the mask."""
    cond = model.encode_prompts(["a red cube", "fog"])
    x = torch.randn(2, *model.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])
    base = model.predict_velocity(x, sigma, cond, CASE.guidance)
    padded = cond.pad_to(cond.sequence_length("prompt_embeds") + 9)
    garbage = dict(padded.tensors)
    for name, mask in padded.masks.items():
        noise = torch.randn(garbage[name].shape, generator=torch.Generator().manual_seed(1))
        garbage[name] = torch.where(garbage[mask][..., None].bool(), garbage[name], noise)
    torch.testing.assert_close(model.predict_velocity(x, sigma, padded, CASE.guidance), base, atol=1e-5, rtol=0)
    torch.testing.assert_close(model.predict_velocity(x, sigma, Conditioning(garbage, padded.masks), CASE.guidance), base,
                               atol=1e-5, rtol=0)
    unmasked = dict(garbage)
    for mask in padded.masks.values():
        unmasked[mask] = torch.ones_like(unmasked[mask])
    moved = model.predict_velocity(x, sigma, Conditioning(unmasked, padded.masks), CASE.guidance)
    assert (moved - base).abs().max() > 1e-3


# --- guidance and packing ---------------------------------------------------------------------
def test_true_cfg_with_norm_by_hand():
    cond = torch.tensor([[[3.0, 4.0], [1.0, 0.0]]])  # norms 5 and 1
    uncond = torch.tensor([[[0.0, 0.0], [0.0, 1.0]]])
    out = true_cfg_with_norm(cond, uncond, 2.0)
    # token 0: comb = 2 * (3, 4) = (6, 8), norm 10 -> rescaled to norm 5: (3, 4)
    # token 1: comb = (0, 1) + 2 * (1, -1) = (2, -1), norm sqrt(5) -> (2, -1) / sqrt(5)
    expected = torch.tensor([[[3.0, 4.0], [2.0 / 5**0.5, -1.0 / 5**0.5]]])
    torch.testing.assert_close(out, expected)


def test_packing_is_the_pipelines_and_inverts():
    x = torch.randn(2, 16, 1, 4, 6)
    packed = pack_latents(x, 2)
    torch.testing.assert_close(packed, QwenImagePipeline._pack_latents(x, 2, 16, 4, 6), atol=0, rtol=0)
    torch.testing.assert_close(unpack_latents(packed, 4, 6, 2), x, atol=0, rtol=0)


# --- schedule and sizes -----------------------------------------------------------------------
def test_the_schedule_is_the_pipelines_dynamic_shift(model):
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps

    for height, width, steps in ((32, 32, 4), (64, 48, 10)):
        tokens = (height // 16) * (width // 16)
        cfg = model.scheduler.config
        mu = calculate_shift(tokens, cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift)
        assert model.schedule_mu(height, width) == pytest.approx(mu)
        scheduler = copy.deepcopy(model.scheduler)
        retrieve_timesteps(scheduler, steps, "cpu", sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        torch.testing.assert_close(model.sigmas(steps, height, width), scheduler.sigmas.float(), atol=0, rtol=0)
    with pytest.raises(ValueError, match="pass height and width"):
        model.sigmas(4)


def test_sizes_the_vae_cannot_take_raise_with_the_nearest_values(model):
    with pytest.raises(ValueError, match=r"rollout.sampling_options.height=40: expected a multiple of 16 .* 32 or 48"):
        model.latent_shape(40, 32)
    with pytest.raises(ValueError, match="num_frames=5"):
        model.latent_shape(32, 32, 5)
    assert model.latent_shape(48, 80) == (16, 1, 6, 10)
    # At config load, before any weights (`size_multiple`).
    with pytest.raises(ConfigError, match="rollout.sampling_options.width=24: expected a multiple of 16"):
        load_config(["model.adapter=QwenImagePipeline", "model.path=tiny:qwen_image", "rollout.sampling_options.width=24"])


# --- decoding ---------------------------------------------------------------------------------
def test_decode_gives_uint8_images_and_refuses_other_shapes(model):
    images = model.decode(torch.zeros(2, *model.latent_shape(HEIGHT, 48)))
    assert images.shape == (2, HEIGHT, 48, 3) and images.dtype == torch.uint8
    with pytest.raises(ValueError, match="1, h, w"):
        model.decode(torch.zeros(1, 16, 4, 4))


def test_the_decoder_responds_to_the_latents(model):
    """A fixed latent step moves brightness by >= 0.05 (0..1 scale), monotonely; latent 0 is mid-grey."""
    shape = (1, *model.latent_shape(HEIGHT, WIDTH))
    brightness = [float(model.decode(torch.full(shape, v)).float().mean()) / 255 for v in (-0.5, 0.0, 0.5)]
    assert brightness[1] == pytest.approx(0.5, abs=0.01)
    assert brightness[2] - brightness[1] >= 0.05 and brightness[1] - brightness[0] >= 0.05
    # Decoding is deterministic and local: a brighter patch of latents brightens only its pixels.
    z = torch.zeros(shape)
    z[..., :2, :2] = 1.0
    image = model.decode(z)[0].float() / 255
    assert image[:16, :16].mean() > image[16:, 16:].mean() + 0.2
    torch.testing.assert_close(model.decode(z), model.decode(z), atol=0, rtol=0)

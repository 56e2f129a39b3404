"""The Qwen-Image-Edit adapters on their tiny models: the shared diffusion adapter suite with a
source image per prompt (tests/adapters/diffusion_suite.py) for `QwenImageEditPipeline`
(`tiny:qwen_image_edit`) and `QwenImageEditPlusPipeline` (`tiny:qwen_image_edit_plus`, with
`zero_cond_t`), then what is particular to them: the source image reaches both the
vision-language embeddings and the transformer, the condition is encoded at the recipe's size,
several source images (Edit-Plus), and the bad-input errors."""
import copy
import hashlib

import numpy as np
import pytest
import torch
from diffusers import QwenImageEditPlusPipeline
from PIL import Image

from omni_rl.data.prompt_item import PromptItem
from omni_rl.models.diffusion import DiffusionModelBase
from tests.adapters.diffusion_suite import AdapterCase, DiffusionAdapterSuite, build, fresh_pipeline

HEIGHT = WIDTH = 32
# The pipeline encodes every source image at about one megapixel (square: 1024 x 1024); the
# suite's pipeline comparisons give the adapter that size too.
PIPELINE_SIZE = [1024, 1024]


def source_image(prompt: str, size: int = 48) -> Image.Image:
    """A deterministic square picture per prompt: a two-colour gradient seeded by its text."""
    seed = int.from_bytes(hashlib.sha1(prompt.encode()).digest()[:4], "little")
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    t = np.linspace(0, 1, size)[:, None, None]
    pixels = (a * (1 - t) + b * t) * np.ones((1, size, 1))
    return Image.fromarray(pixels.astype(np.uint8))


def pipeline(model, fresh: bool):
    cls = type(model.pipeline)
    if fresh:
        pipe = fresh_pipeline(cls, model)
    else:
        pipe = cls(**{**model.pipeline.components, "scheduler": copy.deepcopy(model.scheduler)})
        pipe.set_progress_bar_config(disable=True)
    pipe.prompt_template_encode_start_idx = model.prompt_prefix_length  # the pipeline's 64 is the real tokenizer's
    return pipe


def pipeline_latents(pipe, prompt, latents, steps, guidance, case):
    b, c, _, h, w = latents.shape
    packed = pipe._pack_latents(latents, b, c, h, w)
    image = case.source_image(prompt)
    out = pipe(image=[image] if isinstance(pipe, QwenImageEditPlusPipeline) else image, prompt=prompt,
               negative_prompt="", true_cfg_scale=guidance,
               height=case.height, width=case.width, num_inference_steps=steps, latents=packed,
               output_type="latent").images
    return pipe._unpack_latents(out, case.height, case.width, pipe.vae_scale_factor)


CASE = AdapterCase(
    adapter="QwenImageEditPipeline", tiny="qwen_image_edit", height=HEIGHT, width=WIDTH, steps=4, guidance=4.0,
    model_options={"max_sequence_length": 64}, pipeline=pipeline, pipeline_latents=pipeline_latents,
    load_lora=lambda pipe, folder: pipe.load_lora_weights(folder),
    source_image=source_image, pipeline_options={"condition_image_size": PIPELINE_SIZE},
)


class TestQwenImageEdit(DiffusionAdapterSuite):
    case = CASE


def source_image_at_pipeline_size(prompt: str) -> Image.Image:
    # Edit-Plus resizes the original for its vision tower (384 px) and the adapter resizes the
    # condition image: given at the condition size, both resize the same pixels.
    return source_image(prompt, size=PIPELINE_SIZE[0])


PLUS = AdapterCase(
    adapter="QwenImageEditPlusPipeline", tiny="qwen_image_edit_plus", height=HEIGHT, width=WIDTH, steps=4,
    guidance=4.0, model_options={"max_sequence_length": 64}, pipeline=pipeline, pipeline_latents=pipeline_latents,
    load_lora=lambda pipe, folder: pipe.load_lora_weights(folder),
    source_image=source_image_at_pipeline_size, pipeline_options={"condition_image_size": PIPELINE_SIZE},
)


class TestQwenImageEditPlus(DiffusionAdapterSuite):
    """The suite's checks where Edit-Plus has code of its own (its pipeline, its text encoding
    and image layout when packed); the replay, LoRA export and weightless build run the very
    code of the Edit adapter above, so they are not run twice (CI time)."""

    case = PLUS
    test_the_trainer_replays_the_rollout_log_probs = None
    test_the_lora_export_loads_through_the_pipeline_and_reproduces_the_adapter = None
    test_the_weightless_build_has_the_loaded_architecture = None


@torch.no_grad()
def test_edit_plus_takes_several_source_images_in_order():
    plus = build(PLUS)
    a, b = source_image("a"), source_image("b")
    ab = plus.encode_prompts(["put them side by side"], images=[plus.condition_images([a, b], HEIGHT, WIDTH)])
    ba = plus.encode_prompts(["put them side by side"], images=[plus.condition_images([b, a], HEIGHT, WIDTH)])
    assert ab["image_grid"][0].tolist() == [2, 2, 2, 2] and ab["image_latents"].shape[1] == 8
    assert (ab["prompt_embeds"] - ba["prompt_embeds"]).abs().max() > 1e-3  # "Picture 1" is a, then b
    x = torch.randn(1, *plus.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(0))
    v_ab, v_ba = (plus.predict_velocity(x, torch.tensor([0.7]), c, 4.0) for c in (ab, ba))
    assert (v_ab - v_ba).abs().max() > 1e-4
    with pytest.raises(ValueError, match="at most 3 source image"):
        plus.condition_images([a] * 4, HEIGHT, WIDTH)


@pytest.fixture(scope="module")
def model():
    return build(CASE)


def condition(model, image):
    return model.condition_images([image], HEIGHT, WIDTH)


# --- the source image ----------------------------------------------------------------------
def test_the_condition_is_encoded_at_the_recipes_size(model):
    (image,) = condition(model, source_image("a", size=300))
    assert image.dtype == torch.uint8 and tuple(image.shape) == (HEIGHT, WIDTH, 3)
    wide = build(CASE, condition_image_size=[64, 96])
    (image,) = condition(wide, source_image("a", size=300))
    assert tuple(image.shape) == (64, 96, 3)
    cond = wide.encode_prompts(["make it blue"], images=[(image,)])
    assert tuple(cond["image_grid"][0].tolist()) == (4, 6)  # 16 px per token
    assert cond["image_latents"].shape[1] == 24


@torch.no_grad()
def test_the_source_image_reaches_the_embeddings_and_the_transformer(model):
    red, green = (condition(model, Image.new("RGB", (32, 32), c)) for c in ((220, 20, 20), (20, 220, 20)))
    a = model.encode_prompts(["make it brighter"], images=[red])
    b = model.encode_prompts(["make it brighter"], images=[green])
    assert (a["prompt_embeds"] - b["prompt_embeds"]).abs().max() > 1e-2  # through Qwen2.5-VL
    assert (a["image_latents"] - b["image_latents"]).abs().max() > 1e-3  # through the VAE
    x = torch.randn(1, *model.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.8])
    # The image tokens alone (same embeddings) change the velocity.
    swapped = type(a)({**a.tensors, "image_latents": b["image_latents"]}, dict(a.masks))
    va, vs = model.predict_velocity(x, sigma, a, 4.0), model.predict_velocity(x, sigma, swapped, 4.0)
    assert (va - vs).abs().max() > 1e-4


def test_the_engine_encodes_a_groups_image_once(model, monkeypatch):
    from omni_rl.rollout.native import NativeDiffusionEngine
    from omni_rl.rollout.types import DiffusionRequest

    images = condition(model, source_image("x"))
    requests = [DiffusionRequest(prompt="make it red", seed=s, height=HEIGHT, width=WIDTH, num_steps=2,
                                 guidance_scale=4.0, images=tuple(im.clone() for im in images)) for s in range(3)]
    engine = NativeDiffusionEngine(model, max_num_seqs=3)
    calls = []
    encode = model.encode_prompts
    monkeypatch.setattr(model, "encode_prompts", lambda *a, **k: calls.append(len(a[0])) or encode(*a, **k))
    try:
        engine.generate(requests, timeout_s=600)
    finally:
        engine.close()
    assert calls == [1]  # equal images by content, one encoding for the three


# --- bad input ------------------------------------------------------------------------------
def test_encoding_without_a_source_image_is_refused(model):
    with pytest.raises(ValueError, match="needs source images for every prompt"):
        model.encode_prompts(["make it red"])
    with pytest.raises(ValueError, match="has none"):
        model.condition_images(None, HEIGHT, WIDTH)


def test_a_condition_size_the_vae_cannot_take_is_refused():
    with pytest.raises(ValueError, match=r"model.adapter_options.condition_image_size\[1\]=40: expected a multiple of 16.*32 or 48"):
        build(CASE, condition_image_size=[32, 40]).condition_images([source_image("a")], HEIGHT, WIDTH)


def test_the_prompt_kind_is_checked_against_the_adapter():
    from adapters.qwen_image import QwenImageAdapter
    from adapters.qwen_image_edit import QwenImageEditAdapter

    edit = PromptItem("make it red", media={"images": [source_image("a")]})
    text = PromptItem("a red cube")
    with pytest.raises(ValueError, match="prompt 2 \\('a red cube'\\) has no source image.*edits images"):
        QwenImageEditAdapter.check_prompt_items([edit, text], "data.prompt_file='e.jsonl'", "QwenImageEditPipeline")
    with pytest.raises(ValueError, match="carries a source image.*makes images from text"):
        QwenImageAdapter.check_prompt_items([text, edit], "data.prompt_file='e.jsonl'", "QwenImagePipeline")
    QwenImageEditAdapter.check_prompt_items([edit], "x", "QwenImageEditPipeline")
    DiffusionModelBase.check_prompt_items([text], "x", "StableDiffusion3Pipeline")

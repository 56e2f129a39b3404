"""BAGEL image editing (`BagelForConditionalGeneration`, `model.stage=edit`) on `tiny:bagel_edit`: the
shared diffusion adapter suite with a source image per prompt and image CFG on, against the plain
reference loop of tests/adapters/bagel_reference.py (the source's VAE and ViT blocks prefilled,
then the instruction; text and image CFG); then what is particular to editing: the SigLIP tower
(strict loading, the official transform, transformers' own conv model), image CFG by hand,
packing with other sources and steps, the source's reach into the velocity and the latents, what
trains, the exports and the bad input."""
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from adapters.bagel.adapter import guided_velocity
from adapters.bagel.vision import vit_patches, vit_size
from omni_rl.cli import check_inputs
from omni_rl.compose import load_config
from omni_rl.config.schema import LoraConfig
from omni_rl.errors import ConfigError
from omni_rl.data.prompts import PromptFileError
from omni_rl.models import Conditioning
from omni_rl.models.loading import ModelFolderError, resolve_model_path
from tests.adapters.bagel_reference import load_lora, pipeline, reference_latents, siglip
from tests.adapters.diffusion_suite import AdapterCase, DiffusionAdapterSuite, build

ADAPTER = "BagelForConditionalGeneration"
HEIGHT = WIDTH = 32
# (0.6, 1]: with 4 steps at shift 3 (sigmas 1, 0.9, 0.75, 0.5) the last step runs without CFG.
OPTIONS = {"stage": "edit", "max_sequence_length": 64, "cfg_interval": [0.6, 1.0], "timestep_shift": 3.0,
           "image_guidance_scale": 1.5}


def source_image(prompt: str, size: int = HEIGHT) -> Image.Image:
    """A deterministic picture per prompt (at the condition size, so nothing resamples it): two
    colour bands seeded by its text."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha1(prompt.encode()).digest()[:4], "little"))
    pixels = np.empty((size, size, 3), dtype=np.uint8)
    pixels[: size // 2], pixels[size // 2 :] = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    return Image.fromarray(pixels)


CASE = AdapterCase(adapter=ADAPTER, tiny="bagel_edit", height=HEIGHT, width=WIDTH, steps=4, guidance=4.0,
                   model_options=OPTIONS, pipeline=pipeline, pipeline_latents=reference_latents, load_lora=load_lora,
                   source_image=source_image)


class TestBagelEdit(DiffusionAdapterSuite):
    case = CASE


@pytest.fixture(scope="module")
def model():
    return build(CASE)


def tiny_copy(tmp_path) -> Path:
    folder = tmp_path / "bagel_edit"
    shutil.copytree(resolve_model_path("tiny:bagel_edit"), folder)
    return folder


def encode(model, prompts, images, **kwargs):
    return model.encode_prompts(prompts, images=[model.condition_images([im], HEIGHT, WIDTH) for im in images], **kwargs)


def noise(model, n, seed=0):
    return torch.randn(n, *model.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(seed))


def flat(grey: int) -> Image.Image:
    return Image.new("RGB", (WIDTH, HEIGHT), (grey, grey, grey))


# --- the SigLIP tower ---------------------------------------------------------------------------
def test_the_tower_is_the_official_layout_loaded_strictly(model):
    keys = set(load_file(str(Path(model.path) / "ema.safetensors")))
    vit = {k for k in keys if k.startswith("vit_model.")}
    assert "vit_model.vision_model.embeddings.patch_embedding.weight" in vit
    assert "vit_model.vision_model.post_layernorm.weight" in vit
    # vit_config.json says 2 layers; BAGEL builds (and saves) one; SigLIP's pooling head is not used.
    assert not any(".encoder.layers.1." in k or ".head." in k for k in vit)
    assert len(model.vit.body.encoder.layers) == 1
    assert tuple(model.vit.body.embeddings.patch_embedding.weight.shape) == (16, 3 * 14 * 14)
    assert not any(p.requires_grad for p in model.vit.parameters())


def test_a_renamed_vit_key_is_named(tmp_path):
    folder = tiny_copy(tmp_path)
    ema = load_file(str(folder / "ema.safetensors"))
    ema["vit_model.vision_model.post_layernorm.weight_renamed"] = ema.pop("vit_model.vision_model.post_layernorm.weight")
    save_file(ema, str(folder / "ema.safetensors"))
    with pytest.raises(ModelFolderError, match=r"1 missing \(e.g. \['vit_model.vision_model.post_layernorm.weight'\]\) "
                                               r"and 1 unexpected .*weight_renamed.* SigLIP tensors"):
        build(CASE, path=str(folder))


def test_a_conv_patch_embedding_is_refused_by_shape(tmp_path):
    folder = tiny_copy(tmp_path)
    ema = load_file(str(folder / "ema.safetensors"))
    key = "vit_model.vision_model.embeddings.patch_embedding.weight"
    ema[key] = ema[key].reshape(16, 14, 14, 3).permute(0, 3, 1, 2).contiguous()  # transformers' conv layout
    save_file(ema, str(folder / "ema.safetensors"))
    with pytest.raises(ModelFolderError, match=r"patch_embedding.weight has shape \[16, 3, 14, 14\], expected \[16, 588\]"):
        build(CASE, path=str(folder))


def test_the_official_vit_transform_sizes():
    # BAGEL-7B-MoT: 14 px patches, 70 a side (980 px); short side at least 224 px.
    assert vit_size(1024, 1024, 14, 70) == (980, 980)
    assert vit_size(512, 512, 14, 70) == (518, 518)  # round(512 / 14) = 37 patches
    assert vit_size(100, 300, 14, 70) == (224, 672)  # scaled by 224 / 100
    assert vit_size(32, 32, 14, 4) == (56, 56)  # the tiny tower: the minimum capped at its 4 patches a side
    assert vit_size(32, 48, 14, 4) == (42, 56)


def test_patches_are_bagels_order_with_row_major_positions():
    image = torch.arange(56 * 56 * 3, dtype=torch.float32).reshape(56, 56, 3) % 251
    patches, positions = vit_patches(image.to(torch.uint8), 14, 4)
    pixels = (image / 255.0 - 0.5) / 0.5
    # patch (row 1, col 2): its 14 x 14 x 3 pixels, row by row, channels innermost (hwpqc)
    torch.testing.assert_close(patches[1 * 4 + 2], pixels[14:28, 28:42].reshape(-1), atol=1e-6, rtol=0)
    assert positions.tolist() == list(range(16))
    _, positions = vit_patches(torch.zeros(32, 48, 3, dtype=torch.uint8), 14, 4)  # 3 x 4 patches
    assert positions.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    _, positions = vit_patches(torch.zeros(48, 32, 3, dtype=torch.uint8), 14, 4)  # 4 x 3 patches
    assert positions.tolist() == [0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14]


@torch.no_grad()
def test_the_tower_equals_transformers_conv_model_on_a_full_grid(model):
    image = torch.from_numpy(np.asarray(source_image("a tower", size=56)).copy())
    patches, positions = vit_patches(image, 14, 4)
    ours = model.vit(patches[None], positions[None])
    pixels = (image.permute(2, 0, 1).float() / 255.0 - 0.5) / 0.5
    theirs = siglip(Path(model.path))(pixel_values=pixels[None]).last_hidden_state
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


# --- the source image reaches the model -----------------------------------------------------------
@torch.no_grad()
def test_the_encoder_carries_the_source_brightness(model):
    cond = encode(model, ["x"] * 3, [flat(40), flat(128), flat(215)])
    means = cond["image_latents"].mean(dim=(1, 2)).tolist()
    assert means[0] < means[1] < means[2] and means[2] - means[0] > 1.0  # black -> -1, white -> +1
    # decoded back, brightness keeps the order (the decoder rises with the latent above about -1)
    shape = model.latent_shape(HEIGHT, WIDTH)
    latents = cond["image_latents"].reshape(3, 2, 2, 2, 2, 16).permute(0, 5, 1, 3, 2, 4).reshape(3, *shape)
    brightness = model.decode(latents).float().mean(dim=(1, 2, 3)).tolist()
    assert brightness[0] < brightness[1] < brightness[2]


@torch.no_grad()
def test_a_different_source_changes_the_velocity_through_each_encoding(model):
    a = encode(model, ["make it brighter"], [flat(40)])
    b = encode(model, ["make it brighter"], [flat(215)])
    x, sigma = noise(model, 1), torch.tensor([0.9])
    base = model.predict_velocity(x, sigma, a, 4.0)
    for key in ("image_latents", "vit_features"):
        swapped = Conditioning({**a.tensors, key: b[key]}, dict(a.masks))
        assert (model.predict_velocity(x, sigma, swapped, 4.0) - base).abs().max() > 1e-3, key


# --- guidance -----------------------------------------------------------------------------------
def test_image_cfg_by_hand_with_a_per_sample_renorm():
    c = torch.tensor([[[3.0, 4.0]], [[1.0, 0.0]]])  # norms 5 and 1
    u = torch.tensor([[[1.0, 2.0]], [[1.0, 0.0]]])
    ui = torch.tensor([[[3.0, 2.0]], [[0.0, 0.0]]])
    # sample 0: text CFG 2: u + 2 (c - u) = (5, 6); image CFG 1.5: ui + 1.5 ((5, 6) - ui) = (6, 8), norm
    #   10 -> scaled by 5 / 10: (3, 4); sample 1: (1, 0), then 1.5 (1, 0) = (1.5, 0), norm 1.5 -> by 1 / 1.5.
    # A batch-wide norm would have scaled both by the same factor.
    out = guided_velocity(c, u, 2.0, 0.0, ui, 1.5)
    torch.testing.assert_close(out, torch.tensor([[[3.0, 4.0]], [[1.0, 0.0]]]))
    # renorm_min 1: no rescale, the official combination alone
    torch.testing.assert_close(guided_velocity(c, u, 2.0, 1.0, ui, 1.5), torch.tensor([[[6.0, 8.0]], [[1.5, 0.0]]]))
    # without an image-unconditional velocity: text CFG only (text-to-image)
    torch.testing.assert_close(guided_velocity(c, u, 2.0, 1.0), torch.tensor([[[5.0, 6.0]], [[1.0, 0.0]]]))


@torch.no_grad()
def test_image_cfg_applies_inside_the_interval_only(model):
    plain = build(CASE, image_guidance_scale=1.0)
    cond = encode(model, ["make it brighter"] * 2, [flat(90)] * 2)
    x = noise(model, 1).expand(2, -1, -1, -1)
    sigma = torch.tensor([0.9, 0.5])  # inside and outside (0.6, 1]
    with_image, text_only = model.predict_velocity(x, sigma, cond, 4.0), plain.predict_velocity(x, sigma, cond, 4.0)
    assert (with_image[0] - text_only[0]).abs().max() > 1e-4
    torch.testing.assert_close(with_image[1], text_only[1], atol=1e-6, rtol=0)


@torch.no_grad()
def test_a_sample_is_the_same_alone_and_packed_with_other_sources_steps_and_prompts(model):
    prompts = ["make it brighter", "make the whole picture a lot darker please", "fog"]
    cond = encode(model, prompts, [source_image(p) for p in prompts], negative_prompt="blurry")
    x, sigma = noise(model, 3, seed=4), torch.tensor([0.9, 0.5, 0.75])  # CFG on, off, on
    together = model.predict_velocity(x, sigma, cond, 4.0)
    for i in range(3):
        alone = model.predict_velocity(x[i : i + 1], sigma[i : i + 1], cond.select([i]), 4.0)
        torch.testing.assert_close(together[i : i + 1], alone, atol=1e-5, rtol=0, msg=f"sample {i}")


# --- what trains --------------------------------------------------------------------------------
def test_only_the_generation_side_gets_gradients():
    model = build(CASE, lora=LoraConfig(enabled=False))
    cond = encode(model, ["make it brighter", "fog"], [flat(40), flat(200)])
    model.predict_velocity(noise(model, 2), torch.tensor([0.9, 0.5]), cond, 4.0).square().mean().backward()
    grads = {n: p.grad for n, p in model.network.named_parameters()}
    trained = {n for n, g in grads.items() if g is not None}
    assert trained == {n for n, p in model.network.named_parameters() if p.requires_grad}
    assert all("_moe_gen" in n or n.split(".")[0] in ("time_embedder", "vae2llm", "llm2vae") for n in trained)
    for n in ("vae2llm.weight", "language_model.model.layers.0.self_attn.q_proj_moe_gen.weight"):
        assert grads[n].abs().max() > 0, n
    for n in ("connector.fc1.weight", "connector.fc2.weight", "vit_pos_embed.pos_embed",
              "language_model.model.layers.0.self_attn.q_proj.weight"):
        assert grads[n] is None, n
    assert all(p.grad is None and not p.requires_grad for p in model.vit.parameters())
    assert model.vit in model.frozen_modules() and model.vae in model.frozen_modules()


def test_the_full_export_keeps_the_tower_and_loads_back(tmp_path):
    model = build(CASE, lora=LoraConfig(enabled=False))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    model.save_trained(str(tmp_path / "model"))
    again = build(CASE, path=str(tmp_path / "model"))
    cond = encode(model, ["make it brighter"], [flat(90)])
    x, sigma = noise(model, 1), torch.tensor([0.9])
    with torch.no_grad():
        torch.testing.assert_close(again.predict_velocity(x, sigma, cond, 4.0), model.predict_velocity(x, sigma, cond, 4.0),
                                   atol=1e-5, rtol=0)


# --- bad input ----------------------------------------------------------------------------------
def test_datasets_of_the_other_kind_are_refused_before_the_model_loads():
    edit = ["model.adapter=BagelForConditionalGeneration", "model.path=tiny:bagel_edit", "model.stage=edit"]
    with pytest.raises(PromptFileError, match=r"data.prompts: prompt 1 \('a cat'\) has no source image, but "
                                              r"model.adapter=BagelForConditionalGeneration model.stage=edit edits"):
        check_inputs(load_config([*edit, "data.prompts=[a cat]"]))
    t2i = ["model.adapter=BagelForConditionalGeneration", "model.path=tiny:bagel"]
    with pytest.raises(PromptFileError, match=r"data.prompt_file='recipes/prompts/tiny_edit.jsonl': prompt 1 "
                                              r"\('make it brighter'\) carries a source image.*use model.stage=edit"):
        check_inputs(load_config([*t2i, "data.prompts=null", "data.prompt_file=recipes/prompts/tiny_edit.jsonl"]))


def test_image_cfg_settings_are_checked():
    t2i = ["model.adapter=BagelForConditionalGeneration", "model.path=tiny:bagel"]
    with pytest.raises(ConfigError, match=r"model.adapter_options.image_guidance_scale=1.5: image CFG needs a source image"):
        load_config([*t2i, "model.adapter_options.image_guidance_scale=1.5"])
    edit = [*t2i, "model.stage=edit"]
    load_config([*edit, "model.adapter_options.image_guidance_scale=1.5"])
    with pytest.raises(ConfigError, match=r"model.adapter_options.image_guidance_scale=0.5: expected a number >= 1"):
        load_config([*edit, "model.adapter_options.image_guidance_scale=0.5"])
    with pytest.raises(ConfigError, match=r"model.adapter_options.image_guidance_scale=2.0 with rollout.sampling_options.guidance_scale=1.0: .*"
                                          r"only together with text CFG"):
        load_config([*edit, "model.adapter_options.image_guidance_scale=2.0", "rollout.sampling_options.guidance_scale=1.0"])
    with pytest.raises(ConfigError, match=r"model.adapter_options.condition_image_size\[1\]=40: expected a multiple of 16"):
        load_config([*edit, "model.adapter_options.condition_image_size=[32,40]"])


def test_bad_source_images_are_refused(model):
    with pytest.raises(ValueError, match="needs a source image for every prompt: 1 prompts, none"):
        model.encode_prompts(["make it red"])
    with pytest.raises(ValueError, match="edits a source image: the prompt has none"):
        model.condition_images(None, HEIGHT, WIDTH)
    with pytest.raises(ValueError, match="one source image per prompt, got 2"):
        model.condition_images([flat(1), flat(2)], HEIGHT, WIDTH)
    with pytest.raises(ValueError, match=r"model.adapter_options.condition_image_size\[0\]=144: .* at most 128 px"):
        build(CASE, condition_image_size=[144, 32]).condition_images([flat(1)], HEIGHT, WIDTH)
    small, big = (torch.zeros(s, s, 3, dtype=torch.uint8) for s in (32, 48))
    with pytest.raises(ValueError, match=r"source images of one size, got \[\(32, 32\), \(48, 48\)\]"):
        model.encode_prompts(["a", "b"], images=[(small,), (big,)])

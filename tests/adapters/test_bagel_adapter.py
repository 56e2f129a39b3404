"""The BAGEL adapter (`BagelForConditionalGeneration`) on `tiny:bagel`: the shared diffusion adapter
suite, then what is particular to it: strict loading of the official layout, the per-sample CFG
renorm and interval, which parameters train, the exports, bad input and the responsive decoder.

BAGEL has no diffusers pipeline, so the suite's "pipeline" is `reference_latents`
(tests/adapters/bagel_reference.py): a plain loop over BAGEL's published sampling written on its
own (the text prefilled causally into a KV cache, each step the image block against it, the
empty context for text CFG, the "global" renorm), sharing only the weights with the model."""
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from adapters.bagel.adapter import bagel_schedule, guided_velocity, patchify, unpatchify
from omni_rl.compose import load_config
from omni_rl.config.schema import LoraConfig
from omni_rl.errors import ConfigError
from omni_rl.models.loading import ModelFolderError, resolve_model_path
from tests.adapters.bagel_reference import load_lora, pipeline, reference_latents
from tests.adapters.diffusion_suite import AdapterCase, DiffusionAdapterSuite, build

ADAPTER = "BagelForConditionalGeneration"
HEIGHT = WIDTH = 32
# (0.6, 1]: with 4 steps at shift 3 (sigmas 1, 0.9, 0.75, 0.5) the last step runs without CFG.
OPTIONS = {"max_sequence_length": 64, "cfg_interval": [0.6, 1.0], "timestep_shift": 3.0}

CASE = AdapterCase(adapter=ADAPTER, tiny="bagel", height=HEIGHT, width=WIDTH, steps=4, guidance=4.0,
                   model_options=OPTIONS, pipeline=pipeline, pipeline_latents=reference_latents, load_lora=load_lora)


class TestBagel(DiffusionAdapterSuite):
    case = CASE


@pytest.fixture(scope="module")
def model():
    return build(CASE)


def tiny_copy(tmp_path) -> Path:
    folder = tmp_path / "bagel"
    shutil.copytree(resolve_model_path("tiny:bagel"), folder)
    return folder


def latents(model, n, seed=0):
    return torch.randn(n, *model.latent_shape(HEIGHT, WIDTH), generator=torch.Generator().manual_seed(seed))


# --- the official layout, strictly --------------------------------------------------------------
def test_the_tiny_checkpoint_has_the_official_layout():
    folder = Path(resolve_model_path("tiny:bagel"))
    for name in ("ema.safetensors", "ae.safetensors", "llm_config.json", "vit_config.json", "config.json",
                 "tokenizer_config.json"):
        assert (folder / name).is_file(), name
    keys = set(load_file(str(folder / "ema.safetensors")))
    for key in ("language_model.model.layers.1.self_attn.q_proj_moe_gen.weight", "language_model.model.layers.0.mlp_moe_gen.up_proj.weight",
                "language_model.model.layers.0.self_attn.k_norm_moe_gen.weight", "language_model.model.norm_moe_gen.weight",
                "language_model.model.layers.0.input_layernorm_moe_gen.weight", "language_model.lm_head.weight",
                "time_embedder.mlp.0.weight", "vae2llm.weight", "llm2vae.bias", "latent_pos_embed.pos_embed",
                "connector.fc1.weight", "vit_pos_embed.pos_embed"):
        assert key in keys, key
    assert any(k.startswith("vit_model.") for k in keys)
    # The BFL layout of FLUX's VAE, not diffusers'.
    assert "decoder.up.0.block.0.conv1.weight" in load_file(str(folder / "ae.safetensors"))
    ema = load_file(str(folder / "ema.safetensors"))
    assert ema["llm2vae.weight"].abs().max() > 0  # not the official zero init


def test_a_renamed_key_is_named(tmp_path):
    folder = tiny_copy(tmp_path)
    ema = load_file(str(folder / "ema.safetensors"))
    ema["vae2llm.weight_renamed"] = ema.pop("vae2llm.weight")
    save_file(ema, str(folder / "ema.safetensors"))
    with pytest.raises(ModelFolderError, match=r"1 missing \(e.g. \['vae2llm.weight'\]\) and 1 unexpected .*weight_renamed"):
        build(CASE, path=str(folder))


def test_a_wrong_shape_is_named(tmp_path):
    folder = tiny_copy(tmp_path)
    ema = load_file(str(folder / "ema.safetensors"))
    ema["llm2vae.bias"] = torch.zeros(65)
    save_file(ema, str(folder / "ema.safetensors"))
    with pytest.raises(ModelFolderError, match=r"llm2vae.bias has shape \[65\], expected \[64\]"):
        build(CASE, path=str(folder))


def test_a_folder_without_the_weights_names_the_file(tmp_path):
    folder = tiny_copy(tmp_path)
    (folder / "ema.safetensors").unlink()
    with pytest.raises(ModelFolderError, match=r"ema.safetensors is missing"):
        build(CASE, path=str(folder))


# --- guidance -----------------------------------------------------------------------------------
def test_the_renorm_is_per_sample_by_hand():
    cond = torch.tensor([[[3.0, 4.0]], [[1.0, 0.0]]])  # norms 5 and 1
    uncond = torch.tensor([[[0.0, 0.0]], [[1.0, 0.0]]])
    out = guided_velocity(cond, uncond, 2.0, 0.0)
    # sample 0: guided = 2 (3, 4) = (6, 8), norm 10 -> scale 5 / 10: (3, 4)
    # sample 1: guided = (1, 0) (c = u), norm 1 -> scale 1: (1, 0); a batch-wide norm would mix them
    torch.testing.assert_close(out, torch.tensor([[[3.0, 4.0]], [[1.0, 0.0]]]))
    # renorm_min 1 turns the rescale off: the plain CFG combination
    torch.testing.assert_close(guided_velocity(cond, uncond, 2.0, 1.0), uncond + 2 * (cond - uncond))


@torch.no_grad()
def test_cfg_applies_inside_the_interval_only(model):
    cond = model.encode_prompts(["a red cube", "a red cube"])
    x = latents(model, 1).expand(2, -1, -1, -1)
    sigma = torch.tensor([0.9, 0.5])  # inside and outside (0.6, 1]
    guided = model.predict_velocity(x, sigma, cond, 4.0)
    plain = model.predict_velocity(x, sigma, cond, 1.0)
    torch.testing.assert_close(guided[1], plain[1], atol=1e-6, rtol=0)
    assert (guided[0] - plain[0]).abs().max() > 1e-3


@torch.no_grad()
def test_text_padding_is_inert_and_the_mask_is_used(model):
    cond = model.encode_prompts(["a red cube", "fog"])
    x, sigma = latents(model, 2), torch.tensor([0.9, 0.75])
    base = model.predict_velocity(x, sigma, cond, 4.0)
    padded = cond.pad_to(cond.sequence_length("input_ids") + 7)
    garbage = dict(padded.tensors)
    garbage["input_ids"] = torch.where(padded["text_mask"].bool(), padded["input_ids"], torch.full_like(padded["input_ids"], 70))
    from omni_rl.models import Conditioning

    torch.testing.assert_close(model.predict_velocity(x, sigma, Conditioning(garbage, padded.masks), 4.0), base, atol=1e-5, rtol=0)
    unmasked = dict(garbage, text_mask=torch.ones_like(garbage["text_mask"]))
    assert (model.predict_velocity(x, sigma, Conditioning(unmasked, padded.masks), 4.0) - base).abs().max() > 1e-3


# --- what trains --------------------------------------------------------------------------------
def _gradients(model):
    cond = model.encode_prompts(["a red cube", "fog"])
    model.predict_velocity(latents(model, 2), torch.tensor([0.9, 0.5]), cond, 4.0).square().mean().backward()
    return {n: p.grad for n, p in model.network.named_parameters()}


def test_full_fine_tuning_trains_the_generation_expert_only():
    model = build(CASE, lora=LoraConfig(enabled=False))
    grads = _gradients(model)
    trained = {n for n, g in grads.items() if g is not None}
    assert trained == {n for n, p in model.network.named_parameters() if p.requires_grad}
    assert all("_moe_gen" in n or n.split(".")[0] in ("time_embedder", "vae2llm", "llm2vae") for n in trained)
    for n in ("language_model.model.layers.0.self_attn.q_proj_moe_gen.weight", "language_model.model.norm_moe_gen.weight",
              "language_model.model.layers.1.mlp_moe_gen.down_proj.weight", "time_embedder.mlp.0.weight", "vae2llm.weight",
              "llm2vae.weight"):
        assert n in trained and grads[n].abs().max() > 0, n
    for n in ("language_model.model.layers.0.self_attn.q_proj.weight", "language_model.model.layers.0.mlp.up_proj.weight",
              "language_model.model.embed_tokens.weight", "language_model.lm_head.weight", "latent_pos_embed.pos_embed",
              "connector.fc1.weight"):
        assert grads[n] is None, n


def test_lora_trains_only_its_adapters_on_the_generation_expert():
    model = build(CASE, lora=LoraConfig(enabled=True, rank=4, alpha=8, init="default"))
    with torch.no_grad():  # B = 0 at init: give it values so A gets a gradient too
        for n, p in model.network.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    grads = _gradients(model)
    trained = {n for n, g in grads.items() if g is not None}
    assert trained and all(".lora_" in n and "_moe_gen" in n for n in trained)
    assert len(trained) == 2 * 7 * 2  # A and B, 7 projections, 2 layers


# --- exports ------------------------------------------------------------------------------------
def _perturb(model, seed=3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)


@torch.no_grad()
def _same_velocity(a, b):
    cond = a.encode_prompts(["a red cube"])
    x, sigma = latents(a, 1), torch.tensor([0.9])
    torch.testing.assert_close(a.predict_velocity(x, sigma, cond, 4.0), b.predict_velocity(x, sigma, cond, 4.0), atol=1e-5, rtol=0)


def test_full_weights_export_in_the_official_layout_and_load_back(tmp_path):
    model = build(CASE, lora=LoraConfig(enabled=False))
    _perturb(model)
    model.save_trained(str(tmp_path / "model"))
    assert {"ema.safetensors", "ae.safetensors", "llm_config.json"} <= {p.name for p in (tmp_path / "model").iterdir()}
    assert any(k.startswith("vit_model.") for k in load_file(str(tmp_path / "model" / "ema.safetensors")))
    _same_velocity(model, build(CASE, path=str(tmp_path / "model")))


def test_the_lora_merges_into_the_official_layout(tmp_path):
    model = build(CASE, lora=LoraConfig(enabled=True, rank=4, alpha=8))
    _perturb(model)
    model.save_merged(str(tmp_path / "merged"))
    keys = load_file(str(tmp_path / "merged" / "ema.safetensors"))
    assert not any("lora_" in k or "base_layer" in k for k in keys)
    merged = build(CASE, path=str(tmp_path / "merged"), lora=LoraConfig(enabled=False))
    _same_velocity(model, merged)
    model.save_lora(str(tmp_path / "lora"))
    assert (tmp_path / "lora" / "adapter_model.safetensors").is_file() and (tmp_path / "lora" / "adapter_config.json").is_file()


# --- schedule, sizes, bad input -----------------------------------------------------------------
def test_the_schedule_is_bagels_shifted_linspace(model):
    # s = 3: t' = 3 t / (1 + 2 t) at t = 1, 3/4, 1/2, 1/4, 0 -> 1, 0.9, 0.75, 0.5, 0
    torch.testing.assert_close(model.sigmas(4, HEIGHT, WIDTH), torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0]))
    torch.testing.assert_close(bagel_schedule(2, 1.0), torch.tensor([1.0, 0.5, 0.0]))


def test_patches_are_bagels_order_and_invert():
    x = torch.randn(2, 16, 4, 6)
    tokens = patchify(x)
    ref = torch.einsum("chpwq->hwpqc", x[1].reshape(16, 2, 2, 3, 2)).reshape(6, 64)
    torch.testing.assert_close(tokens[1], ref, atol=0, rtol=0)
    torch.testing.assert_close(unpatchify(tokens, 2, 3), x, atol=0, rtol=0)


def test_bad_sizes_and_image_cfg_are_refused(model):
    with pytest.raises(ValueError, match=r"rollout.sampling_options.height=40: expected a multiple of 16 .* 32 or 48"):
        model.latent_shape(40, 32)
    with pytest.raises(ValueError, match=r"rollout.sampling_options.width=144: .* at most 128 px"):
        model.latent_shape(32, 144)
    base = [f"model.adapter={ADAPTER}", "model.path=tiny:bagel"]
    with pytest.raises(ConfigError, match="rollout.sampling_options.width=24: expected a multiple of 16"):
        load_config([*base, "rollout.sampling_options.width=24"])
    with pytest.raises(ConfigError, match=r"model.adapter_options.image_guidance_scale=1.5: image CFG needs a source image"):
        load_config([*base, "model.adapter_options.image_guidance_scale=1.5"])
    with pytest.raises(ConfigError, match=r"model.adapter_options.cfg_interval=\[0.9, 0.4\]"):
        load_config([*base, "model.adapter_options.cfg_interval=[0.9,0.4]"])


# --- decoding -----------------------------------------------------------------------------------
def test_the_decoder_responds_to_the_latents(model):
    shape = (1, *model.latent_shape(HEIGHT, WIDTH))
    brightness = [float(model.decode(torch.full(shape, v)).float().mean()) / 255 for v in (-0.5, 0.0, 0.5)]
    assert brightness[1] == pytest.approx(0.5, abs=0.01)
    assert brightness[2] - brightness[1] >= 0.05 and brightness[1] - brightness[0] >= 0.05
    images = model.decode(torch.zeros(2, *model.latent_shape(HEIGHT, 48)))
    assert images.shape == (2, HEIGHT, 48, 3) and images.dtype == torch.uint8
    with pytest.raises(ValueError, match="16, h, w"):
        model.decode(torch.zeros(1, 16, 1, 4, 4))

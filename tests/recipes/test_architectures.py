"""The real recipes' architectures ship without weights, and build at their published sizes.

`recipes/architectures/<org>--<name>/` holds the configuration files of the checkpoint a real
recipe names as `model.path: <org>/<name>` (the hub id with its "/" written "--", the layout
Hugging Face's own cache uses), with a SOURCE.md naming where each file came from. These tests
check that (the mapping is `omni_rl.plan.architecture.shipped_folder`):

- every real recipe (a `model.path` that is not `tiny:...`) has its folder, each folder lists
  every file it ships in its SOURCE.md, and no folder holds a weight or a tokenizer vocabulary;
- each trained network, built on the meta device from those files through the same loading code
  the adapters use (`omni_rl.models.pretrained.load_pretrained` with `weights=False`; BAGEL's
  own `BagelNetwork` from `llm_config.json`), has the checkpoint's published size;
- the reward models' folders (`recipes/architectures/rewards/<org>--<name>/`) meet the same
  folder rules, and those with a published size build at it (transformers' class on meta).

What "published size" is compared: the count of the tensors a checkpoint stores (parameters and
persistent buffers: SD3.5's positional table is a buffer in diffusers and a tensor in the
checkpoint). A published figure is usually rounded ("20B"), so a count matches when it is within
2% of the figure or rounds to it at the figure's own precision (20.43B is "20B"); each case
below says which and cites the figure's source.
"""
from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from omni_rl.config import available_recipes
from omni_rl.config.loader import PROJECT_ROOT
from omni_rl.models.pretrained import load_pretrained
from omni_rl.plan.architecture import ARCHITECTURES, shipped_folder

PROJECT_RECIPES = {name: path for name, path in available_recipes().items() if path.parent == PROJECT_ROOT / "recipes"}
# Weight and vocabulary files never ship here (issue 26: configs only).
FORBIDDEN_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".model", ".tiktoken")
FORBIDDEN_NAMES = ("vocab.json", "merges.txt", "tokenizer.json", "spiece.model")


def real_recipes() -> dict[str, str]:
    """Recipe name -> model.path, for every shipped recipe that names a real checkpoint."""
    out = {}
    for name, file in sorted(PROJECT_RECIPES.items()):
        path = OmegaConf.load(file).model.path
        if not str(path).startswith("tiny:"):
            out[name] = str(path)
    return out


def stored_tensor_count(module: torch.nn.Module) -> int:
    """Elements of every tensor the module's checkpoint stores (parameters and persistent
    buffers), each shared tensor once."""
    seen, total = set(), 0
    for tensor in module.state_dict(keep_vars=True).values():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel()
    return total


def matches_published(count: int, published: str) -> bool:
    """`count` agrees with a published size such as "2.5B": within 2% of it, or equal to it
    when rounded to the figure's own precision (half a unit of its last digit)."""
    figure = Decimal(published.removesuffix("B"))
    half_unit = Decimal(1).scaleb(figure.as_tuple().exponent) / 2
    value = Decimal(count) / Decimal(10**9)
    return abs(value - figure) <= max(figure * Decimal("0.02"), half_unit)


def test_matches_published_by_hand():
    assert matches_published(2_470_000_000, "2.5B")  # 1.2% below: within 2%
    assert not matches_published(2_243_000_000, "2.5B")  # 10% below, and rounds to 2.2
    assert matches_published(20_430_000_000, "20B")  # 2.15% above, but rounds to 20
    assert not matches_published(20_600_000_000, "20B")  # rounds to 21
    assert matches_published(7_680_000_000, "7.61B")  # 0.9%
    assert not matches_published(7_800_000_000, "7.61B")  # 2.5%, and 7.80 is not 7.61


def test_the_project_ships_real_recipes():
    assert len(real_recipes()) >= 8


@pytest.mark.parametrize("name", sorted(real_recipes()))
def test_every_real_recipe_has_its_architecture(name):
    model_path = real_recipes()[name]
    folder = shipped_folder(model_path)
    assert folder.is_dir(), f"recipe {name}: model.path={model_path!r} has no folder {folder.relative_to(PROJECT_ROOT)}"
    configs = [p for p in folder.rglob("*.json")]
    assert configs, f"{folder} holds no config file"


REWARD_ARCHITECTURES = ARCHITECTURES / "rewards"


def architecture_folders() -> list[Path]:
    """Every checkpoint folder: the policies' at the top, the reward models' under `rewards/`."""
    top = [p for p in ARCHITECTURES.iterdir() if p.is_dir() and p != REWARD_ARCHITECTURES]
    rewards = [p for p in REWARD_ARCHITECTURES.iterdir() if p.is_dir()] if REWARD_ARCHITECTURES.is_dir() else []
    return sorted(top + rewards)


@pytest.mark.parametrize("folder", architecture_folders(), ids=lambda p: p.name)
def test_folder_names_its_sources_and_ships_no_weights(folder):
    source = folder / "SOURCE.md"
    assert source.is_file(), f"{folder} has no SOURCE.md naming where its files came from"
    text = source.read_text()
    for file in sorted(folder.rglob("*")):
        if not file.is_file() or file == source:
            continue
        rel = file.relative_to(folder).as_posix()
        assert not file.name.endswith(FORBIDDEN_SUFFIXES) and file.name not in FORBIDDEN_NAMES, f"{rel}: no weights or vocabularies here"
        assert f"`{rel}`" in text, f"{folder.name}/SOURCE.md does not name `{rel}`"
        json.loads(file.read_text())  # every shipped file is a JSON config


def test_bagel_llm_config_passes_the_loaders_checks():
    """BAGEL's loader refuses a rope_scaling and wants the Qwen2 keys (issue 26, point 5)."""
    from adapters.bagel.network import LLMConfig

    config = LLMConfig.from_json(ARCHITECTURES / "ByteDance-Seed--BAGEL-7B-MoT" / "llm_config.json")
    assert (config.hidden_size, config.num_hidden_layers) == (3584, 28)


BAGEL_FOLDER = ARCHITECTURES / "ByteDance-Seed--BAGEL-7B-MoT"


def test_bagel_folder_passes_the_model_folder_check_a_snapshot_passes():
    """The shipped folder against the check a downloaded snapshot meets before loading (a
    config.json, every JSON readable), and the grid sides the adapter reads from it."""
    from adapters.bagel.adapter import DEFAULT_MAX_LATENT_SIZE, DEFAULT_VIT_SIDE, grid_side
    from omni_rl.models.loading import check_model_folder

    check_model_folder(BAGEL_FOLDER, "ByteDance-Seed/BAGEL-7B-MoT", weights=False)
    assert grid_side(BAGEL_FOLDER, "latent_pos_embed.pos_embed", "max_latent_size", 0) == DEFAULT_MAX_LATENT_SIZE == 64
    assert grid_side(BAGEL_FOLDER, "vit_pos_embed.pos_embed", "vit_max_num_patch_per_side", 0) == DEFAULT_VIT_SIDE == 70


@pytest.mark.parametrize("scaling, plain", [
    (None, True), ({}, True), ({"rope_type": "default"}, True), ({"type": "default", "factor": 1.0}, True),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, False),
    ({"type": "linear", "factor": 2.0}, False), ({"rope_type": "default", "factor": 2.0}, False),
])
def test_bagel_llm_config_variants_a_real_file_may_carry(tmp_path, scaling, plain):
    """Qwen2 configs as transformers releases write them: extra keys the network does not read,
    and `rope_scaling` null, absent, or "default"; a scaling the network does not implement is
    refused in one line naming the value."""
    from adapters.bagel.network import LLMConfig

    raw = json.loads((BAGEL_FOLDER / "llm_config.json").read_text())
    raw.update(torch_dtype="bfloat16", transformers_version="4.43.1", sliding_window=131072, qk_norm=True,
               layer_module="Qwen2MoTDecoderLayer", rope_scaling=scaling)
    file = tmp_path / "llm_config.json"
    file.write_text(json.dumps(raw))
    if plain:
        assert LLMConfig.from_json(file).hidden_size == 3584
        del raw["rope_scaling"]
        file.write_text(json.dumps(raw))
        assert LLMConfig.from_json(file).rope_theta == 1e6
    else:
        with pytest.raises(ValueError, match=r"rope_scaling=.*; this network implements plain RoPE only") as err:
            LLMConfig.from_json(file)
        assert "\n" not in str(err.value)


# --- parameter counts at the published sizes --------------------------------------------------


def _diffusers(cls_name: str, folder: str, subfolder: str) -> torch.nn.Module:
    import diffusers

    return load_pretrained(getattr(diffusers, cls_name), str(ARCHITECTURES / folder), torch.bfloat16, subfolder, weights=False)


def _qwen3_omni_thinker_language_model() -> tuple[int, int]:
    """(total, active per token) of the thinker's MoE decoder with its LM head. The thinker is
    built alone from `thinker_config`: the shipped config.json lacks talker keys the full
    model's build needs (SOURCE.md), and the thinker is what the recipe trains."""
    from transformers import AutoConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerForConditionalGeneration

    from omni_rl.device import weightless_device

    config = AutoConfig.from_pretrained(str(ARCHITECTURES / "Qwen--Qwen3-Omni-30B-A3B-Instruct"))
    with weightless_device():
        thinker = Qwen3OmniMoeThinkerForConditionalGeneration(config.thinker_config)
    decoder = [p for n, p in thinker.named_parameters() if n.startswith(("model.language_model.", "lm_head."))]
    experts = sum(p.numel() for n, p in thinker.named_parameters() if ".experts." in n)
    text = thinker.config.text_config
    total = sum(p.numel() for p in decoder)
    return total, total - experts + experts * text.num_experts_per_tok // text.num_experts


def _bagel() -> tuple[int, int]:
    """(total, one pathway) of BAGEL's network as its adapter builds it; a token runs through
    either the understanding or the generation (`*_moe_gen`) expert, so the active count is
    the total less the generation expert."""
    from adapters.bagel.adapter import DEFAULT_MAX_LATENT_SIZE, DEFAULT_VIT_SIDE
    from adapters.bagel.network import BagelNetwork, LLMConfig

    folder = ARCHITECTURES / "ByteDance-Seed--BAGEL-7B-MoT"
    llm = LLMConfig.from_json(folder / "llm_config.json")
    vit_hidden = json.loads((folder / "vit_config.json").read_text())["hidden_size"]
    with torch.device("meta"):
        network = BagelNetwork(llm, DEFAULT_MAX_LATENT_SIZE, vit_hidden, DEFAULT_VIT_SIDE)
    total = stored_tensor_count(network)
    generation = sum(p.numel() for n, p in network.named_parameters() if "moe_gen" in n)
    return total, total - generation


# (id, build -> count, published figure, its source)
SIZES = [
    ("sd35-medium-mmdit", lambda: stored_tensor_count(_diffusers("SD3Transformer2DModel", "stabilityai--stable-diffusion-3.5-medium", "transformer")),
     "2.5B", "stabilityai/stable-diffusion-3.5-medium model card and release post: 2.5 billion parameters"),
    ("qwen-image-mmdit", lambda: stored_tensor_count(_diffusers("QwenImageTransformer2DModel", "Qwen--Qwen-Image", "transformer")),
     "20B", "Qwen-Image technical report (arXiv 2508.02324) and model card: a 20B MMDiT image foundation model"),
    ("qwen-image-edit-2511-mmdit", lambda: stored_tensor_count(_diffusers("QwenImageTransformer2DModel", "Qwen--Qwen-Image-Edit-2511", "transformer")),
     "20B", "Qwen-Image-Edit model card: built on the 20B Qwen-Image model"),
    ("wan22-t2v-a14b-high-noise-expert", lambda: stored_tensor_count(_diffusers("WanTransformer3DModel", "Wan-AI--Wan2.2-T2V-A14B-Diffusers", "transformer")),
     "14B", "Wan2.2 README (Wan-Video/Wan2.2): A14B, two experts of about 14B parameters each"),
    ("wan22-t2v-a14b-low-noise-expert", lambda: stored_tensor_count(_diffusers("WanTransformer3DModel", "Wan-AI--Wan2.2-T2V-A14B-Diffusers", "transformer_2")),
     "14B", "Wan2.2 README (Wan-Video/Wan2.2): A14B, two experts of about 14B parameters each"),
    ("wan22-ti2v-5b", lambda: stored_tensor_count(_diffusers("WanTransformer3DModel", "Wan-AI--Wan2.2-TI2V-5B-Diffusers", "transformer")),
     "5B", "Wan2.2 README (Wan-Video/Wan2.2): TI2V-5B, a 5B dense model"),
    ("bagel-7b-mot-total", lambda: _bagel()[0],
     "14B", "BAGEL model card / arXiv 2505.14683: 7B active parameters, 14B total"),
    ("bagel-7b-mot-one-pathway", lambda: _bagel()[1],
     "7.61B", "Qwen2.5-7B model card (7.61B parameters), BAGEL's initialisation; a token uses one expert"),
    ("qwen3-omni-thinker-moe-total", lambda: _qwen3_omni_thinker_language_model()[0],
     "30.5B", "Qwen3-30B-A3B model card (30.5B in total), the thinker's MoE decoder (Qwen3-Omni report, arXiv 2509.17765)"),
    ("qwen3-omni-thinker-moe-active", lambda: _qwen3_omni_thinker_language_model()[1],
     "3.3B", "Qwen3-30B-A3B model card (3.3B activated): 8 of 128 experts per token"),
    ("flux1-dev-mmdit", lambda: stored_tensor_count(_diffusers("FluxTransformer2DModel", "black-forest-labs--FLUX.1-dev", "transformer")),
     "12B", "black-forest-labs/FLUX.1-dev model card: a 12 billion parameter rectified flow transformer"),
    ("flux1-kontext-dev-mmdit", lambda: stored_tensor_count(_diffusers("FluxTransformer2DModel", "black-forest-labs--FLUX.1-Kontext-dev", "transformer")),
     "12B", "black-forest-labs/FLUX.1-Kontext-dev model card: a 12 billion parameter rectified flow transformer"),
    ("z-image-turbo-dit", lambda: stored_tensor_count(_diffusers("ZImageTransformer2DModel", "Tongyi-MAI--Z-Image-Turbo", "transformer")),
     "6B", "Z-Image report (Z-Image: An Efficient Image Generation Foundation Model with Single-Stream Diffusion Transformer) and model card: a 6B-parameter single-stream DiT"),
    ("flux2-klein-9b-transformer", lambda: stored_tensor_count(_diffusers("Flux2Transformer2DModel", "black-forest-labs--FLUX.2-klein-9B", "transformer")),
     "9B", "black-forest-labs/FLUX.2-klein-9B model card: a 9 billion parameter rectified flow transformer"),
    ("minimax-h3-transformer", lambda: stored_tensor_count(_diffusers("MiniMaxH3Transformer3DModel", "MiniMaxAI--MiniMax-H3", "transformer")),
     "33B", "SD.Next's MiniMax wiki (Vladmandic/sdnext): a 33B transformer; the released checkpoint's tensors are 66.28 GB in bf16 (recipes/architectures/MiniMaxAI--MiniMax-H3/SOURCE.md)"),
    ("hunyuan-video15-480p-t2v-transformer", lambda: stored_tensor_count(_diffusers("HunyuanVideo15Transformer3DModel", "hunyuanvideo-community--HunyuanVideo-1.5-Diffusers-480p_t2v", "transformer")),
     "8.3B", "HunyuanVideo-1.5 README (Tencent-Hunyuan/HunyuanVideo-1.5): a video generation model with only 8.3B parameters"),
]


def _reward(folder: str, part: str | None = None) -> int:
    """Stored tensors of a reward model built on the meta device from its shipped config.json
    with the transformers class the config names (or of one submodule of it)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(REWARD_ARCHITECTURES / folder))
    with torch.device("meta"):
        model = getattr(transformers, config.architectures[0])(config)
    return stored_tensor_count(model.get_submodule(part) if part else model)


# Reward models (recipes/architectures/rewards/); the two CLAP checkpoints have no published
# total to compare (their SOURCE.md says so).
SIZES += [
    ("reward-clip-vit-large-patch14", lambda: _reward("openai--clip-vit-large-patch14"),
     "0.42762B", "open_clip docs/model_profile.csv: ViT-L-14, 427.62M parameters (OpenAI's CLIP ViT-L/14)"),
    ("reward-pickscore-v1-clip-vit-h-14", lambda: _reward("yuvalkirstain--PickScore_v1"),
     "0.98611B", "open_clip docs/model_profile.csv: ViT-H-14, 986.11M parameters (PickScore_v1 fine-tunes laion's ViT-H/14)"),
    ("reward-whisper-large-v3", lambda: _reward("openai--whisper-large-v3"),
     "1.55B", "openai/whisper README size table and the large-v3 model card: large, 1550 M parameters"),
    ("reward-wavlm-base-plus-sv-backbone", lambda: _reward("microsoft--wavlm-base-plus-sv", "wavlm"),
     "0.0947B", "WavLM paper (arXiv 2110.13900) model table: WavLM Base / Base+, 94.70M parameters"),
]


@pytest.mark.parametrize("build, published, source", [s[1:] for s in SIZES], ids=[s[0] for s in SIZES])
def test_built_architecture_has_the_published_size(build, published, source):
    count = build()
    assert matches_published(count, published), (
        f"built {count / 1e9:.3f}B, published {published} ({source})"
    )

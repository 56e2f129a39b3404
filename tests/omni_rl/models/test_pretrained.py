"""Weightless adapters (the Ray driver's view): built on the meta device from configs alone.

Each tiny adapter built on the meta device has the loaded model's architecture (the same
parameter names, shapes and trainable tensors) and answers the questions the driver asks
(prompt tokens, latent shapes) exactly as the loaded model does, without reading weight files.
"""
import shutil
from pathlib import Path

import pytest
import torch

from omni_rl.config.schema import LoraConfig, ModelConfig
from omni_rl.device import weightless_device
from omni_rl.models import build_model
from omni_rl.models.loading import resolve_model_path
from omni_rl.models.pretrained import load_pretrained

ADAPTERS = [
    ("StableDiffusion3Pipeline", None, "tiny:sd3"),
    ("Qwen3ForCausalLM", None, "tiny:qwen3"),
    ("Qwen3OmniMoeForConditionalGeneration", "thinker", "tiny:qwen3_omni"),
]


def shapes(module: torch.nn.Module) -> dict[str, tuple]:
    return {n: (tuple(p.shape), p.dtype, p.requires_grad) for n, p in module.named_parameters()}


def without_weight_files(path: str, tmp_path: Path) -> str:
    """A copy of a model folder with every weight file removed."""
    copy = tmp_path / "no_weights"
    shutil.copytree(path, copy)
    for f in [*copy.rglob("*.safetensors"), *copy.rglob("*.bin")]:
        f.unlink()
    return str(copy)


@pytest.mark.parametrize("adapter,stage,path", ADAPTERS)
def test_weightless_adapter_has_the_loaded_architecture_and_no_storage(tmp_path, adapter, stage, path):
    cfg = ModelConfig(adapter=adapter, stage=stage, path=path, lora=LoraConfig(enabled=True))
    loaded = build_model(cfg, torch.device("cpu"))
    cfg_no_weights = ModelConfig(
        adapter=adapter, stage=stage, path=without_weight_files(resolve_model_path(path), tmp_path),
        lora=LoraConfig(enabled=True),
    )
    view = build_model(cfg_no_weights, weightless_device())
    assert view.weightless and not loaded.weightless
    assert shapes(view.trainable_module()) == shapes(loaded.trainable_module())
    assert sorted(view.named_trainable_tensors()) == sorted(loaded.named_trainable_tensors())
    for module in [view.trainable_module(), *view.frozen_modules()]:
        assert all(p.is_meta for p in module.parameters())
    if loaded.family == "diffusion":
        assert view.latent_shape(64, 32) == loaded.latent_shape(64, 32)
        torch.testing.assert_close(view.sigmas(6), loaded.sigmas(6), rtol=0, atol=0)
    else:
        chat = [{"role": "user", "content": "what is 2 + 3?"}]
        assert torch.equal(view.encode_prompt(chat).input_ids, loaded.encode_prompt(chat).input_ids)
        assert view.pad_token_id == loaded.pad_token_id


def test_loading_with_weights_needs_the_weight_files(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = without_weight_files(resolve_model_path("tiny:qwen3"), tmp_path)
    skeleton = load_pretrained(AutoModelForCausalLM, folder, torch.bfloat16, weights=False)
    assert {(p.device.type, p.dtype) for p in skeleton.parameters()} == {("meta", torch.bfloat16)}
    with pytest.raises(OSError):
        load_pretrained(AutoModelForCausalLM, folder, torch.float32)


def test_weightless_diffusers_module_in_the_asked_dtype():
    from diffusers import SD3Transformer2DModel

    skeleton = load_pretrained(SD3Transformer2DModel, resolve_model_path("tiny:sd3"), torch.float16, "transformer", weights=False)
    assert {(p.device.type, p.dtype) for p in skeleton.parameters()} == {("meta", torch.float16)}
    assert torch.get_default_dtype() == torch.float32  # the default dtype is restored

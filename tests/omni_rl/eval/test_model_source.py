"""`--eval-model`: a LoRA made by another framework loads through the model's own library, and a
LoRA of another model is refused naming its key.

The foreign LoRA is made with diffusers and PEFT directly, as another trainer would: PEFT's
`LoraConfig` added to the tiny shape model's SD3 transformer, its B matrices set to random
values (a fresh LoRA is a no-op), and saved with the pipeline's own `save_lora_weights`.
"""
import json

import pytest
import torch
from safetensors.torch import save_file

from omni_rl.compose import load_config
from omni_rl.eval.job import EvalRequest, run_eval
from omni_rl.eval.model_source import EvalModelError

RECIPE = ["recipe=tiny_sd3_shapes_counting"]
FAST = ("samples_per_prompt=1",)


def evaluate(out, model=None):
    return run_eval(load_config(RECIPE), EvalRequest("geneval_shapes", out=str(out), model=model, protocol=FAST),
                    progress=False)


def foreign_lora(folder):
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from omni_rl.models.loading import resolve_model_path

    transformer = SD3Transformer2DModel.from_pretrained(resolve_model_path("tiny:sd3_shapes"), subfolder="transformer")
    transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    StableDiffusion3Pipeline.save_lora_weights(folder, transformer_lora_layers=get_peft_model_state_dict(transformer),
                                               transformer_lora_adapter_metadata=transformer.peft_config["default"].to_dict())
    return folder


def test_a_lora_another_framework_saved_loads_and_changes_the_samples(tmp_path):
    lora = foreign_lora(tmp_path / "lora")
    base = evaluate(tmp_path / "base")
    tuned = evaluate(tmp_path / "tuned", model=str(lora))
    assert tuned["model"]["weights"] == "lora"
    assert list(tuned["model"]["sha256"]) == ["pytorch_lora_weights.safetensors"]
    a = (tmp_path / "base" / "samples" / "000000_0.png").read_bytes()
    b = (tmp_path / "tuned" / "samples" / "000000_0.png").read_bytes()
    assert a != b  # the same seed through another function
    assert base["counts"] == tuned["counts"]


@pytest.mark.parametrize("tensors, message", [
    ({"transformer.no_such_block.to_q.lora_A.weight": torch.zeros(4, 32),
      "transformer.no_such_block.to_q.lora_B.weight": torch.zeros(32, 4)}, "names no linear layer"),
    ({"transformer.transformer_blocks.0.attn.to_q.lora_A.weight": torch.zeros(4, 7),
      "transformer.transformer_blocks.0.attn.to_q.lora_B.weight": torch.zeros(7, 4)}, "has shapes"),
    ({"text_encoder.x.weight": torch.zeros(2, 2)}, "holds no LoRA tensors"),
])
def test_a_lora_that_does_not_fit_is_one_error_naming_its_key(tmp_path, tensors, message):
    file = tmp_path / "pytorch_lora_weights.safetensors"
    save_file(tensors, str(file))
    with pytest.raises(EvalModelError, match=message):
        evaluate(tmp_path / "out", model=str(tmp_path))
    assert not (tmp_path / "out" / "results.json").exists()
    assert json.loads((tmp_path / "out" / "run.json").read_text())["model"]["weights"] == "lora"

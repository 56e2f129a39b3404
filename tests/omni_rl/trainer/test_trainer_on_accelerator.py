"""The tiny recipes in one process on an accelerator (`gpu` marker: CUDA by default, see
tests/conftest.py), in fp32 and bf16: the loop runs, the rollout and the trainer agree, the
on-policy ratio is 1, and the LoRA export loads where the model's library loads LoRA (BAGEL: its PEFT file is written)."""
import json
import math

import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.models.loading import resolve_model_path
from omni_rl.trainer import PPOTrainer

pytestmark = pytest.mark.gpu

COMMON = ["trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", "trainer.val_every=0", "trainer.total_steps=3"]
SD3 = ["recipe=tiny_sd3_flowgrpo", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4",
       "trainer.mini_batch_size=8", "trainer.micro_batch_size=4"]
QWEN3 = ["recipe=tiny_qwen3_grpo", "trainer.micro_batch_size=8", "rollout.sampling_options.max_new_tokens=8"]
# bf16 weights: the rollout and the trainer run the same bf16 kernels on the same batches, but a
# micro-batch is not a rollout batch, so they agree to bf16 rounding rather than to fp32's.
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}


def train(tmp_path, accel_device, *overrides):
    out = tmp_path / "run"
    PPOTrainer(load_config([*COMMON, f"trainer.device={accel_device}", f"trainer.output_dir={out}", *overrides])).fit()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
    for rec in records:
        assert all(math.isfinite(rec[k]) for k in ("loss/total", "actor/grad_norm", "reward/total/mean")), rec
    return out, records


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_sd3_flowgrpo(tmp_path, accel_device, dtype):
    from diffusers import StableDiffusion3Pipeline

    out, records = train(tmp_path, accel_device, *SD3, f"model.dtype={dtype}")
    for rec in records:
        assert rec["actor/first_minibatch_ratio_max_abs_dev"] <= TOLERANCE[dtype]
        assert rec["rollout_corr/logprob_abs_diff_max"] <= TOLERANCE[dtype]
    pipe = StableDiffusion3Pipeline.from_pretrained(resolve_model_path("tiny:sd3"), text_encoder_3=None, tokenizer_3=None)
    pipe.load_lora_weights(str(out / "lora"))
    assert any("lora" in name for name, _ in pipe.transformer.named_parameters())


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_tiny_sd3_flowgrpo_compiled(tmp_path, accel_device, mode):
    """`model.compile_options` on the GPU, inductor's kernels and with CUDA graphs
    (`reduce-overhead`): the loop runs, the on-policy ratio is 1 within fp32's bound, and nothing
    recompiles after the first step (rollout batches of 8, micro-batches of 4)."""
    if not accel_device.startswith("cuda"):
        pytest.skip(f"CUDA graphs need CUDA; the accelerator is {accel_device}")
    _, records = train(tmp_path, accel_device, *SD3, "model.compile_options.enabled=true",
                       f"model.compile_options.mode={mode}")
    for rec in records:
        assert rec["actor/first_minibatch_ratio_max_abs_dev"] <= TOLERANCE["float32"]
        assert rec["rollout_corr/logprob_abs_diff_max"] <= TOLERANCE["float32"]
    graphs = [rec["perf/compiled_graphs"] for rec in records]
    assert graphs[0] > 0 and graphs == [graphs[0]] * len(graphs)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_qwen3_grpo(tmp_path, accel_device, dtype):
    from transformers import AutoModelForCausalLM

    out, records = train(tmp_path, accel_device, *QWEN3, f"model.dtype={dtype}")
    for rec in records:
        assert rec["rollout_corr/logprob_abs_diff_max"] <= TOLERANCE[dtype]
        assert rec["rollout_corr/logprob_pearson"] >= 0.99
    model = AutoModelForCausalLM.from_pretrained(out / "model")  # full fine-tuning: the whole model
    assert sum(p.numel() for p in model.parameters()) > 0
    assert torch.isfinite(next(model.parameters())).all()


BAGEL_SMALL = ["trainer.prompts_per_step=2", "trainer.samples_per_prompt=4", "trainer.mini_batch_size=8",
               "trainer.micro_batch_size=4"]


@pytest.mark.parametrize("recipe", ["tiny_bagel_flowgrpo", "tiny_bagel_edit_flowgrpo", "tiny_bagel_think_flowgrpo"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_bagel(tmp_path, accel_device, recipe, dtype):
    """BAGEL text-to-image, editing and think-then-draw on the accelerator: the MoT forward in
    bf16 (step maths in fp32), rollout and trainer agreeing, the on-policy ratio 1."""
    out, records = train(tmp_path, accel_device, f"recipe={recipe}", *BAGEL_SMALL, f"model.dtype={dtype}")
    for rec in records:
        assert rec["actor/first_minibatch_ratio_max_abs_dev"] <= TOLERANCE[dtype]
        assert rec["rollout_corr/logprob_abs_diff_max"] <= TOLERANCE[dtype]
    assert (out / "lora" / "adapter_model.safetensors").is_file()

"""Token distillation through the text family (`omni_rl.families.token_teachers`) on the tiny Qwen3."""
import json

import pytest

from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import TINY_QWEN3

# One step, one mini-batch of 16 samples: the update's only forward sees the weights that sampled.
ONE = [*TINY_QWEN3, "trainer.total_steps=1", "trainer.prompts_per_step=4", "trainer.samples_per_prompt=4",
       "trainer.mini_batch_size=16", "trainer.micro_batch_size=16", "trainer.save_every=0"]


@pytest.mark.parametrize("form", ["reward", "direct", "full_vocab"])
def test_a_teacher_equal_to_the_student_has_zero_kl_in_every_form(tmp_path, form):
    # The recipe trains every weight (no LoRA), so the teacher is a second copy of the base model.
    trainer = PPOTrainer(load_config([
        *ONE, "algo.family_options.teachers=[{name: base}]", "algo.family_options.distill_coef=1.0",
        f"algo.family_options.distill_form={form}", "algo.family_options.distill_chunk_size=5",
        f"trainer.output_dir={tmp_path / 'run'}"]))
    teacher = trainer.actors.family.teachers[0]
    assert not teacher.shares_student and teacher.model is not trainer.model
    trainer.fit()
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert abs(record["distill/kl"]) < 1e-6 and abs(record["distill/base/kl"]) < 1e-6
    assert record["timing/teacher"] > 0


@pytest.mark.parametrize("overrides, expected", [
    (["algo.family_options.teachers=[{name: t}]"], "unused with distill_coef=0"),
    (["algo.family_options.distill_coef=1"], "expected 0 without teachers"),
    (["algo.family_options.teachers=[{name: t, guidance_scale: 2.0}]", "algo.family_options.distill_coef=1"],
     "are for diffusion teachers"),
    (["algo.family_options.distill_form=forward"], "expected one of reward, direct, full_vocab"),
])
def test_bad_token_distillation_settings_fail_at_load(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config([*TINY_QWEN3, *overrides])


def test_a_text_teacher_of_another_family_is_refused_at_load(tmp_path):
    from omni_rl.families.teachers import TeacherConfigError

    with pytest.raises(TeacherConfigError, match="is a StableDiffusion3Pipeline, the student .* a Qwen3ForCausalLM"):
        PPOTrainer(load_config([*ONE, "algo.family_options.teachers=[{name: t, path: 'tiny:sd3'}]",
                                "algo.family_options.distill_coef=1.0", f"trainer.output_dir={tmp_path / 'run'}"]))


def a_second_tiny_qwen3(folder):
    """The tiny Qwen3's checkpoint with its weight matrices (the tied embedding included) moved by
    seeded noise: a teacher of the student's architecture and tokenizer that predicts other tokens."""
    import shutil
    from pathlib import Path

    import torch
    from safetensors.torch import load_file, save_file

    from omni_rl.models.loading import resolve_model_path

    shutil.copytree(Path(resolve_model_path("tiny:qwen3", None)), folder)
    tensors = load_file(folder / "model.safetensors")
    g = torch.Generator().manual_seed(0)
    moved = {k: v + 0.5 * torch.randn(v.shape, generator=g, dtype=v.dtype) if v.ndim == 2 else v for k, v in tensors.items()}
    save_file(moved, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_two_teachers_each_score_their_own_data_source_and_log_their_own_kl(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "metadata": {"data_source": s}}) + "\n" for p, s in [
        ("Say something.", "same"), ("Write a word.", "same"), ("Count to three.", "other"), ("Name an animal.", "other")]))
    other = a_second_tiny_qwen3(tmp_path / "other")
    trainer = PPOTrainer(load_config([
        *ONE, f"data.prompt_file={prompts}", "data.prompts=null",
        f"algo.family_options.teachers=[{{name: same, data_source: same}}, {{name: other, path: '{other}', data_source: other}}]",
        "algo.family_options.distill_coef=1.0", f"trainer.output_dir={tmp_path / 'run'}"]))
    trainer.fit()
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # The `same` teacher is a copy of the student: its source's KL is 0. The `other` teacher's
    # moved weights give its own source's samples a KL well above rounding; the mean lies between.
    assert abs(record["distill/same/kl"]) < 1e-6
    assert record["distill/other/kl"] > 1e-2
    assert record["distill/same/kl"] < record["distill/kl"] < record["distill/other/kl"]

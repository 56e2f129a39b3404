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


@pytest.mark.long
def test_a_grpo_trained_teacher_teaches_a_fresh_tiny_qwen3(tmp_path):
    # The recipe's whole run (about a minute on 2 cores, plus the teacher's GRPO run): the
    # per-token reverse KL falls more than 10x and the held-out reward rises by more than 3
    # standard errors, with the reward's weight 0 (the teacher is the only signal).
    import hashlib
    import math

    PPOTrainer(load_config(["recipe=tiny_qwen3_grpo", "trainer.val_every=0", "trainer.save_every=0",
                            f"trainer.output_dir={tmp_path / 'teacher'}"])).fit()
    weights = tmp_path / "teacher" / "model" / "model.safetensors"
    before = hashlib.sha256(weights.read_bytes()).hexdigest()
    PPOTrainer(load_config(["recipe=tiny_qwen3_distill", "trainer.save_every=0",
                            f"algo.family_options.teachers=[{{name: lowercase, path: '{weights.parent}'}}]",
                            f"trainer.output_dir={tmp_path / 'student'}"])).fit()
    records = [json.loads(line) for line in (tmp_path / "student" / "metrics.jsonl").read_text().splitlines()]
    kl = [r["distill/kl"] for r in records if "distill/kl" in r]
    assert sum(kl[:5]) / 5 > 10 * sum(kl[-5:]) / 5
    val = [r for r in records if "val/reward/char_match/mean" in r]
    first, last, n = val[0], val[-1], 4 * 16
    se = math.hypot(first["val/reward/char_match/std"], last["val/reward/char_match/std"]) / math.sqrt(n)
    assert last["val/reward/char_match/mean"] - first["val/reward/char_match/mean"] > 3 * se
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == before


def test_an_omni_thinker_teacher_scores_image_and_audio_prompts(tmp_path):
    # The tiny Qwen3-Omni thinker, LoRA student: a teacher that is a second copy of the base reads
    # each prompt's image and audio itself. The student's LoRA starts at a zero delta, so the two
    # agree up to rounding (the teacher scores its own batch shapes).
    import shutil
    from pathlib import Path

    import numpy as np

    shutil.copy(Path(__file__).resolve().parents[3] / "recipes" / "prompts" / "tiny_omni_images" / "red_square.png",
                tmp_path / "square.png")
    tone = np.sin(np.arange(8000) / 16000 * 2 * np.pi * 440).round(4).tolist()
    prompts = tmp_path / "omni.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "images": ["square.png"],
                                           "audio": [{"array": tone, "sample_rate": 16000}]}) + "\n"
                               for p in ("What do you see and hear?", "Describe the picture and the sound.")))
    trainer = PPOTrainer(load_config([
        "recipe=tiny_qwen3_omni_gspo", "trainer.val_every=0", "trainer.logger_options.progress_bar=false",
        "trainer.loggers=[jsonl]", "trainer.total_steps=1", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
        "trainer.mini_batch_size=4", "trainer.micro_batch_size=4", "trainer.save_every=0", "data.prompts=null",
        f"data.prompt_file={prompts}", "algo.family_options.teachers=[{name: base, path: 'tiny:qwen3_omni'}]",
        "algo.family_options.distill_coef=1.0", f"trainer.output_dir={tmp_path / 'run'}"]))
    teacher = trainer.actors.family.teachers[0]
    assert not teacher.shares_student and teacher.model is not trainer.model
    trainer.fit()
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert abs(record["distill/kl"]) < 1e-4 and record["timing/teacher"] > 0


def test_a_teacher_whose_scores_are_not_finite_stops_the_run_naming_it():
    import torch

    from omni_rl.families.teachers import TeacherOptions, TeacherOutputError
    from omni_rl.families.token_teachers import TokenDistillOptions, TokenTeacher, token_distill

    class Micro:
        prompts, media = ["one", "two"], [{}, {}]

        def select(self, rows):
            return self

    class Broken(TokenTeacher):
        def log_probs(self, micro, media):
            return torch.tensor([[-1.0, -2.0], [float("nan"), -1.0]])

    teacher = Broken(TeacherOptions(name="maths"), model=None, shares_student=False)
    options = TokenDistillOptions(teachers=[TeacherOptions(name="maths")], distill_coef=1.0)
    with pytest.raises(TeacherOutputError, match=r"teacher 'maths': its scores of sample 1 \('two'\) are not finite"):
        token_distill([teacher], [0, 0], Micro(), torch.zeros(2, 2), torch.ones(2, 2), options, None)


def test_a_text_teacher_of_another_tokenizer_is_one_error_line_and_exit_2(tmp_path, capsys):
    # The tiny Qwen3's checkpoint with one more special token: the same architecture, another vocabulary.
    import shutil
    from pathlib import Path

    from omni_rl.cli import main
    from omni_rl.models.loading import resolve_model_path

    other = shutil.copytree(Path(resolve_model_path("tiny:qwen3", None)), tmp_path / "other")
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    taken = {t["id"] for t in tokenizer["added_tokens"]} | set(tokenizer["model"]["vocab"].values())
    tokenizer["added_tokens"].append({"id": max(taken) + 1, "content": "<|extra|>", "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": True})
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    code = main([*ONE, f"algo.family_options.teachers=[{{name: t, path: '{other}'}}]", "algo.family_options.distill_coef=1.0",
                 f"trainer.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: algo.family_options.teachers[0].path=")
    assert "its tokenizer's vocabulary differs from the student's" in err[-1]

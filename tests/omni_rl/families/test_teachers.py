"""On-policy distillation through the diffusion family (`omni_rl.families.teachers`): routing,
load-time errors, and short runs on the tiny SD3 whose teachers score the student's own steps."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.config.options import bind_options
from omni_rl.families.diffusion import DiffusionOptions
from omni_rl.families.teachers import TeacherConfigError, TeacherOptions, route
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import TINY_SD3

REPO_ROOT = Path(__file__).resolve().parents[3]
DISTIL = [*TINY_SD3, "algo.policy_loss=distill_kl", "trainer.total_steps=1"]


def bind_teachers(blocks):
    """The teachers' blocks as the composition root binds them: inside the family's options."""
    return bind_options(DiffusionOptions, {"teachers": blocks}, "algo.family_options", "model family diffusion").teachers


def _records(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_routing_by_data_source_with_a_default():
    teachers = bind_teachers([{"name": "maths", "data_source": "gsm8k"}, {"name": "rest"}])
    assert route(teachers, {"data_source": "gsm8k"}) == 0
    assert route(teachers, {"data_source": "ocr"}) == 1
    assert route(teachers, {}) == 1
    only = bind_teachers([{"name": "maths", "data_source": "gsm8k", "metadata_key": "source"}])
    assert route(only, {"source": "gsm8k"}) == 0 and route(only, {"data_source": "gsm8k"}) is None


@pytest.mark.parametrize("blocks, expected", [
    ([{"name": "a"}, {"name": "a", "data_source": "x"}], "name a appears more than once"),
    ([{"name": "a"}, {"name": "b"}], "data_source None appears more than once"),
    ([{"name": "a", "data_source": "x"}, {"name": "b", "data_source": "y", "metadata_key": "k"}], "metadata_key"),
    ([{"name": "a/b"}], "without '/'"),
    ([{"name": "a", "guidnce_scale": 2.0}], "has no option 'guidnce_scale'"),
])
def test_bad_teacher_blocks_are_one_line_naming_them(blocks, expected):
    with pytest.raises((TeacherConfigError, ConfigError), match=expected):
        bind_teachers(blocks)


@pytest.mark.parametrize("overrides, expected", [
    (["algo.policy_loss=distill_kl"], "expected algo.family_options.teachers"),
    (["algo.family_options.distill_coef=0.5"], "expected 0 without algo.family_options.teachers"),
    (["algo.family_options.teachers=[{name: t}]"], "unused with algo.policy_loss=flow_grpo"),
    (["algo.policy_loss=distill_kl", "algo.family_options.teachers=[{name: t}]", "algo.family_options.distill_coef=1"],
     "the teachers' KL is the whole loss"),
    (["algo.policy_loss=diffusion_nft", "algo.family_options.teachers=[{name: t}]", "algo.family_options.distill_coef=1"],
     "a forward-process loss stores no trajectory"),
])
def test_inconsistent_distillation_settings_fail_at_load(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(overrides)


@pytest.mark.parametrize("teacher, expected", [
    # A model of another architecture: FLUX.1 is not the student's StableDiffusion3Pipeline.
    ("{name: flux, path: 'tiny:flux'}", "is a FluxPipeline, the student ('tiny:sd3_shapes') a StableDiffusion3Pipeline"),
    # The same architecture in another latent space: the random tiny SD3's VAE is not the shape model's.
    ("{name: other, path: 'tiny:sd3'}", "must share the student's latent space"),
    # A prompt (no metadata) that no teacher covers, and no default teacher.
    ("{name: maths, data_source: gsm8k}", "has data_source=None, which no teacher"),
], ids=["family", "latent_space", "data_source"])
def test_a_teacher_that_cannot_teach_is_one_error_line_and_exit_2(tmp_path, teacher, expected):
    result = subprocess.run(
        [sys.executable, "main_omni.py", "recipe=tiny_sd3_shapes_distill", f"algo.family_options.teachers=[{teacher}]",
         f"trainer.output_dir={tmp_path / 'run'}", "trainer.total_steps=1", "trainer.val_every=0"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    # The student loads first (transformers' progress bars on stderr); then one error line, the last.
    errors = [line for line in lines if "error" in line.lower() or "Traceback" in line]
    assert errors == [lines[-1]] and lines[-1].startswith("error: ") and expected in lines[-1], result.stderr


def test_the_students_own_base_as_teacher_gives_exactly_zero_kl_and_no_update(tmp_path):
    # The student's LoRA starts at B = 0, so the student is its base: a teacher that is the base
    # (the student's model with LoRA disabled, the same guidance) has the very same transition
    # means, the KL is exactly 0 and so is its gradient: Adam leaves every B at 0 (the weight decay
    # shrinks the A matrices alone), and the student stays its base.
    trainer = PPOTrainer(load_config([*DISTIL, "algo.family_options.teachers=[{name: base}]",
                                      f"trainer.output_dir={tmp_path / 'run'}"]))
    teacher = trainer.actors.family.teachers[0]
    assert teacher.shares_student
    trainer.fit()
    (record,) = _records(tmp_path / "run")
    assert record["distill/kl"] == 0.0 and record["distill/base/kl"] == 0.0 and record["loss/total"] == 0.0
    assert record["timing/teacher"] > 0
    b = {n: t for n, t in trainer.model.named_trainable_tensors().items() if ".lora_B." in n}
    assert b and all(not t.any() for t in b.values())


def test_two_teachers_each_teach_their_own_prompts(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a red cat", "metadata": {"data_source": "cats"}}\n'
                       '{"prompt": "a blue dog", "metadata": {"data_source": "dogs"}}\n')
    # Both teachers are the student's base; the cats' teacher guides with scale 1 (no CFG), so only
    # the cats' samples differ from the student's means at the start (its LoRA is 0).
    trainer = PPOTrainer(load_config([
        *DISTIL, f"data.prompt_file={prompts}", "data.prompts=null", "rollout.sampling_options.guidance_scale=4.5",
        "algo.family_options.teachers=[{name: cats, data_source: cats, guidance_scale: 1.0}, {name: others}]",
        f"trainer.output_dir={tmp_path / 'run'}"]))
    trainer.fit()
    (record,) = _records(tmp_path / "run")
    # The teachers score their own samples in batches of another size than the student's: the
    # others' KL is float32 rounding (BLAS rounds by shape), the cats' the missing guidance.
    assert record["distill/others/kl"] < 1e-4 and record["distill/cats/kl"] > 100 * record["distill/others/kl"]
    assert record["distill/kl"] > 0


@pytest.fixture(scope="module")
def teacher_lora(tmp_path_factory):
    """A teacher LoRA that the project's own training wrote (one FlowGRPO step, exported), at a
    learning rate that moves it well away from the base."""
    folder = tmp_path_factory.mktemp("teacher")
    PPOTrainer(load_config([*TINY_SD3, "trainer.total_steps=1", "optim.lr=0.05",
                            f"trainer.output_dir={folder / 'run'}"])).fit()
    return folder / "run" / "lora"


def test_a_lora_teacher_teaches_and_its_weights_never_change(tmp_path, teacher_lora):
    lora = teacher_lora
    assert (lora / "pytorch_lora_weights.safetensors").is_file()
    trainer = PPOTrainer(load_config([*DISTIL, "trainer.total_steps=2", f"algo.family_options.teachers=[{{name: t, lora: '{lora}'}}]",
                                      f"trainer.output_dir={tmp_path / 'run'}"]))
    teacher = trainer.actors.family.teachers[0]
    assert not teacher.shares_student and teacher.model is not trainer.model
    assert not any(p.requires_grad for p in teacher.model.trainable_module().parameters())
    before = teacher.checksum()
    student_before = {n: t.clone() for n, t in trainer.model.named_trainable_tensors().items()}
    trainer.fit()
    assert teacher.checksum() == before
    records = _records(tmp_path / "run")
    assert len(records) == 2 and all(0 < r["distill/kl"] < float("inf") for r in records)
    after = trainer.model.named_trainable_tensors()
    assert any(not torch.equal(student_before[n], after[n]) for n in student_before)


def test_distillation_beside_flow_grpo_and_the_reference_kl_adds_up(tmp_path):
    # flow_grpo + kl_coef x (KL to the reference) + distill_coef x (KL to the teacher, here the base
    # without guidance): each chunk's total is the sum, so the step's means add up the same way.
    trainer = PPOTrainer(load_config([
        *TINY_SD3, "trainer.total_steps=1", "algo.kl_coef=0.5", "algo.family_options.distill_coef=2.0",
        "algo.family_options.teachers=[{name: unguided, guidance_scale: 1.0}]", "rollout.sampling_options.guidance_scale=4.5",
        f"trainer.output_dir={tmp_path / 'run'}"]))
    trainer.fit()
    (r,) = _records(tmp_path / "run")
    assert r["distill/kl"] > 0 and r["loss/kl"] >= 0
    assert r["loss/total"] == pytest.approx(r["loss/policy"] + 0.5 * r["loss/kl"] + 2.0 * r["distill/kl"], rel=1e-5)


def test_the_plan_counts_one_teacher_forward_per_trained_pass():
    from omni_rl.plan.steps import StepTrace, step_flops
    from omni_rl.plan.trace import Trace

    # The rollout trace: 8 samples with CFG (16 rows), 1600 FLOPs, so 100 per row; a micro-batch of 2.
    step = StepTrace(rollout=Trace(1600, 0), train=Trace(300, 0), rollout_batch=8, train_batch=2)
    base = load_config([*TINY_SD3, "rollout.sampling_options.guidance_scale=4.5"])
    cfg = load_config([*TINY_SD3, "rollout.sampling_options.guidance_scale=4.5", "algo.policy_loss=distill_kl",
                       "algo.family_options.teachers=[{name: a, data_source: a, guidance_scale: 1.0}, {name: b}]"])
    passes = base.trainer.prompts_per_step * base.trainer.samples_per_prompt * base.rollout.sampling_options.num_steps / 2
    # Teacher b guides (CFG, 2 rows a sample): 2 samples x 2 rows x 100 = 400 FLOPs more per pass.
    assert step_flops(cfg, step)["update"] - step_flops(base, step)["update"] == pytest.approx(passes * 400)


def test_a_think_draw_model_refuses_teachers():
    with pytest.raises(ConfigError, match="expected none for a think-draw model"):
        load_config(["recipe=tiny_bagel_think_flowgrpo", "algo.family_options.teachers=[{name: t}]",
                     "algo.family_options.distill_coef=1.0"])


def test_teachers_of_one_base_share_one_copy_and_each_runs_with_its_own_adapter(tmp_path, teacher_lora):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a red cat", "metadata": {"data_source": "tuned"}}\n'
                       '{"prompt": "a blue dog", "metadata": {"data_source": "plain"}}\n')
    # Both teachers are tiny:sd3 (the student's base): `tuned` with the FlowGRPO LoRA, `plain`
    # without one. One frozen copy holds both; the student's LoRA starts at 0, so it is the base.
    trainer = PPOTrainer(load_config([
        *DISTIL, f"data.prompt_file={prompts}", "data.prompts=null",
        f"algo.family_options.teachers=[{{name: tuned, lora: '{teacher_lora}', data_source: tuned}}, "
        "{name: plain, path: 'tiny:sd3', data_source: plain}]", f"trainer.output_dir={tmp_path / 'run'}"]))
    tuned, plain = trainer.actors.family.teachers
    assert tuned.model is plain.model and tuned.model is not trainer.model
    assert (tuned.adapter, plain.adapter, tuned.adapted) == ("tuned", None, ("transformer",))
    assert not any(p.requires_grad for p in tuned.model.trainable_module().parameters())
    trainer.fit()
    (record,) = _records(tmp_path / "run")
    # `plain` runs with the adapter off: the student's base, up to rounding (other batch shapes);
    # `tuned` with its LoRA on: a KL far above that.
    assert record["distill/plain/kl"] < 1e-4 and record["distill/tuned/kl"] > 100 * record["distill/plain/kl"]

"""Teachers with `placement: pool` (`omni_rl.workers.teacher_pool`): Ray actors of their own score
the student's stored steps, a micro-batch's rows split among them, checked like a colocated
teacher's; the devices a run asks for are checked against the machine's at load."""
import json
import os

import pytest
import torch

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.families.teachers import PooledTeacher, TeacherOutputError, split_rows, teacher_step_means
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import TINY_SD3

DISTIL = [*TINY_SD3, "algo.policy_loss=distill_kl", "trainer.total_steps=1", "trainer.val_every=0"]


def test_rows_are_split_evenly_and_none_is_empty():
    assert split_rows(5, 2) == [(0, 3), (3, 5)]
    assert split_rows(1, 3) == [(0, 1)]  # one row, one actor: no empty call
    assert split_rows(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]


@pytest.mark.long  # about a minute on 2 busy cores: two actors each build the shape model
def test_a_pooled_teacher_scores_the_students_steps_in_its_own_actors(ray_local, tmp_path):
    # The pool's teacher is the student's base, built in two actors of its own; the student's
    # LoRA starts at B = 0, so its means are the teacher's up to float rounding (the actors see
    # one row each: another batch shape than the student's).
    cfg = load_config([*DISTIL, "algo.family_options.teachers=[{name: base, placement: pool, pool_workers: 2}]",
                       f"trainer.output_dir={tmp_path / 'run'}"])
    trainer = PPOTrainer(cfg)
    try:
        (teacher,) = trainer.actors.family.teachers
        assert isinstance(teacher, PooledTeacher) and len(teacher.pool.actors) == 2
        assert {info["pid"] for info in teacher.pool.infos}.isdisjoint({os.getpid()})  # their own processes
        assert len(teacher.checksum()) == 64  # asked of its first actor
        trainer.fit()
    finally:
        trainer._close()
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 0 <= record["distill/kl"] < 1e-4 and record["distill/base/kl"] == record["distill/kl"]
    assert record["timing/teacher"] > 0
    assert trainer.teacher_pools.actors == []  # ended with the run


def test_a_pooled_teachers_bad_output_names_it():
    """What comes back from a pool is checked on the trainer's side, as a colocated teacher's."""

    class Pool:
        def scatter(self, method, n, args_of):
            return [torch.full((n, 4), float("nan"))]

    teacher = PooledTeacher.__new__(PooledTeacher)
    teacher.name, teacher.guidance_scale, teacher.device, teacher.pool = "far", 4.5, torch.device("cpu"), Pool()

    class Micro:
        prompts = ["one", "two"]
        metadata = [{}, {}]
        sigmas = sigmas_next = noise_levels = torch.full((2, 1), 0.5)
        kernel = "sde"
        conditioning = None

        def step_latents(self, j):
            return torch.zeros(2, 4), torch.zeros(2, 4)

    with pytest.raises(TeacherOutputError, match=r"teacher 'far': its velocity for sample 0 \('one'\)"):
        teacher_step_means([teacher], [0, 0], Micro(), 0, torch.zeros(2, 4))


def test_a_pool_with_no_devices_left_is_one_error_line_and_exit_2(tmp_path, capsys, monkeypatch):
    # A machine of 2 GPUs: 2 training ranks take both, so the teacher's pool has none left.
    monkeypatch.setattr("omni_rl.workers.teacher_pool.device_count", lambda kind: 2)
    code = main(["recipe=tiny_sd3_shapes_distill", "trainer.device=cuda", "trainer.backend=ray",
                 "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2",
                 "algo.family_options.teachers=[{name: counting, placement: pool}]",
                 f"trainer.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: the run asks for 3 GPU devices (2 training rank(s)"), err
    assert "1 for teacher 'counting''s pool" in err[-1] and "this machine has 2: no devices left" in err[-1]
    assert "placement=colocated" in err[-1]


@pytest.mark.long  # about a minute: two actors each build the tiny Qwen3
@pytest.mark.parametrize("form", ["reward", "full_vocab"])
def test_a_pooled_text_teacher_scores_the_students_tokens(ray_local, tmp_path, form):
    from tests.tiny_runs import TINY_QWEN3

    # The recipe trains every weight: the pool's teacher is a copy of the student's base, so the
    # KL is float rounding (the actors score 8 rows each, the student 16).
    trainer = PPOTrainer(load_config([
        *TINY_QWEN3, "trainer.total_steps=1", "trainer.prompts_per_step=4", "trainer.samples_per_prompt=4",
        "trainer.mini_batch_size=16", "trainer.micro_batch_size=16", "trainer.save_every=0",
        "algo.family_options.teachers=[{name: base, placement: pool, pool_workers: 2}]",
        "algo.family_options.distill_coef=1.0", f"algo.family_options.distill_form={form}",
        f"trainer.output_dir={tmp_path / 'run'}"]))
    trainer.fit()
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert abs(record["distill/base/kl"]) < 1e-4 and record["timing/teacher"] > 0

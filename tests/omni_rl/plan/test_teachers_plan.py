"""`--plan` with on-policy distillation's teachers (`omni_rl.plan.teachers`): each teacher's weights
sit whole on every training device, its forward joins the training peak and the update's FLOPs."""
import pytest

from omni_rl.compose import load_config
from omni_rl.plan.planner import make_plan

BASE = ["recipe=tiny_qwen3_grpo", "algo.family_options.max_prompt_tokens=24"]


def two_teachers(tmp_path) -> list[str]:
    """The base (full fine-tuning: a second copy) and another checkpoint of it (a copied folder)."""
    import shutil
    from pathlib import Path

    from omni_rl.models.loading import resolve_model_path

    other = shutil.copytree(Path(resolve_model_path("tiny:qwen3", None)), tmp_path / "other")
    return [f"algo.family_options.teachers=[{{name: a}}, {{name: b, path: '{other}', data_source: x}}]",
            "algo.family_options.distill_coef=1.0"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The plan without teachers, and the student's weights on a device (one copy of the base)."""
    plan = make_plan(load_config([*BASE, f"trainer.output_dir={tmp_path_factory.mktemp('plain')}"]))
    return plan, plan["per_device_bytes"]["trainable_weights"] + plan["per_device_bytes"]["frozen_weights"]


def test_each_teacher_adds_its_weights_to_both_peaks_and_its_forward_to_training(tmp_path, plain):
    plain, _ = plain
    taught = make_plan(load_config([*BASE, *two_teachers(tmp_path), f"trainer.output_dir={tmp_path}"]))
    assert plain["teachers"] == {"models": [], "device_bytes": 0}
    # Full fine-tuning: a teacher without a path is a second copy of the base, as large as the
    # student's weights; the other checkpoint is a third.
    student = plain["per_device_bytes"]["trainable_weights"] + plain["per_device_bytes"]["frozen_weights"]
    assert [t["bytes"] for t in taught["teachers"]["models"]] == [student, student]
    assert taught["teachers"]["device_bytes"] == 2 * student
    forward = taught["trace"]["teacher_forward"]["activation_bytes"]
    assert forward > 0
    assert taught["peaks"]["training"] == plain["peaks"]["training"] + 2 * student + forward
    assert taught["peaks"]["rollout"] == plain["peaks"]["rollout"] + 2 * student
    assert taught["flops_per_step"]["rollout"] == plain["flops_per_step"]["rollout"]
    assert taught["flops_per_step"]["update"] > plain["flops_per_step"]["update"]
    assert taught["roofline"]["update"]["bytes_read_per_device"] > plain["roofline"]["update"]["bytes_read_per_device"]


def test_a_teacher_that_is_the_students_own_base_holds_no_weights(tmp_path):
    # LoRA training: the base with its LoRA off teaches, no second copy.
    plan = make_plan(load_config([*BASE, "model.lora.enabled=true", "algo.family_options.teachers=[{name: base}]",
                                  "algo.family_options.distill_coef=1.0", f"trainer.output_dir={tmp_path}"]))
    (row,) = plan["teachers"]["models"]
    assert row["shares_student"] and row["bytes"] == 0 and plan["teachers"]["device_bytes"] == 0
    assert plan["trace"]["teacher_forward"]["activation_bytes"] > 0


def test_teachers_of_one_base_count_it_once(tmp_path):
    # Two LoRA teachers of the student's base: one copy holds both (their LoRAs are adapters on it).
    plan = make_plan(load_config([*BASE, "model.lora.enabled=true", "algo.family_options.distill_coef=1.0",
                                  "algo.family_options.teachers=[{name: a, path: 'tiny:qwen3'}, "
                                  "{name: b, path: 'tiny:qwen3', data_source: x}]", f"trainer.output_dir={tmp_path}"]))
    a, b = plan["teachers"]["models"]
    assert a["bytes"] > 0 and b["bytes"] == 0 and "the base of teacher 'a'" in b["where"]
    assert plan["teachers"]["device_bytes"] == a["bytes"]


def test_a_pooled_teacher_is_counted_on_its_pool_not_on_the_training_devices(tmp_path, plain):
    plain, student = plain
    pooled = make_plan(load_config([*BASE, "algo.family_options.distill_coef=1.0", f"trainer.output_dir={tmp_path}",
                                    "algo.family_options.teachers=[{name: big, placement: pool, pool_workers: 2}]"]))
    (row,) = pooled["teachers"]["models"]
    assert row["bytes"] == student and "its pool: 2 device(s)" in row["where"]
    assert pooled["teachers"]["device_bytes"] == 0
    # The training devices hold neither its weights nor its forward; its pool holds both.
    assert pooled["peaks"]["training"] == plain["peaks"]["training"]
    assert pooled["peaks"]["rollout"] == plain["peaks"]["rollout"]
    (pool,) = pooled["teacher_pools"]
    forward = pooled["trace"]["teacher_forward"]["activation_bytes"]
    assert pool == {"teacher": "big", "workers": 2, "weights_bytes": student, "peak_bytes": student + forward}


def test_a_colocated_teacher_on_fsdp2_ranks_is_counted_as_its_share(tmp_path, plain):
    _, student = plain
    two = make_plan(load_config([
        *BASE, "trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2",
        "trainer.mini_batch_size=8", "trainer.micro_batch_size=2", "algo.family_options.distill_coef=1.0",
        "algo.family_options.teachers=[{name: a}]", f"trainer.output_dir={tmp_path}"]))
    (half,) = two["teachers"]["models"]
    # Full fine-tuning: the teacher is a second copy of the base (whole: the student's weights in
    # one process). The tiny Qwen3 is all trained network (its trainable_root): half on each of 2 ranks.
    assert half["bytes"] == -(-student // 2)
    assert "1/2 of it" in half["where"] and two["teachers"]["device_bytes"] == half["bytes"]

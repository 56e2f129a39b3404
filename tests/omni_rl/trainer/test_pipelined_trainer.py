"""The PPO trainer with trainer.pipeline one_step_off / async on the tiny Qwen3 and SD3 (native
engine on a copy of the model; seconds per run)."""
import json
import time

import torch

from omni_rl.compose import load_config
from omni_rl.trainer import PPOTrainer
from omni_rl.trainer.local_actors import LocalActorGroup
from tests.tiny_runs import TINY_SD3

QWEN = ["recipe=tiny_qwen3_grpo", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", "trainer.val_every=0",
        "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4", "trainer.mini_batch_size=4",
        "trainer.micro_batch_size=4", "rollout.sampling_options.max_new_tokens=8"]


def run(tmp_path, name, *overrides, base=QWEN):
    out = tmp_path / name
    trainer = PPOTrainer(load_config([*base, f"trainer.output_dir={out}", *overrides]))
    trainer.fit()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return trainer, [r for r in records if "reward/total/mean" in r]


def assert_same_weights(a, b):
    a, b = a.model.named_trainable_tensors(), b.model.named_trainable_tensors()
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=0, msg=name)


def test_async_with_max_staleness_0_trains_what_on_policy_trains(tmp_path):
    on_policy, _ = run(tmp_path, "on", "trainer.total_steps=3")
    fresh, records = run(tmp_path, "async", "trainer.total_steps=3", "trainer.pipeline=async", "trainer.pipeline_options.max_staleness=0")
    assert_same_weights(on_policy, fresh)
    assert all(r["rollout_corr/staleness_max"] == 0 for r in records)


def test_one_step_off_resumes_exactly(tmp_path):
    pipelined = ["trainer.pipeline=one_step_off", "algo.rollout_correction_options.level=token"]
    straight, records = run(tmp_path, "straight", "trainer.total_steps=4", *pipelined)
    run(tmp_path, "split", "trainer.total_steps=2", *pipelined)
    resumed, _ = run(tmp_path, "split", "trainer.total_steps=4", f"trainer.resume={tmp_path / 'split'}", *pipelined)
    assert_same_weights(straight, resumed)
    # Step 3's rollout was in flight at the checkpoint: saved as (step, version), sampled again.
    state = json.loads((tmp_path / "split" / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert state["pipeline"]["units"] == [[3, 1]]
    assert [r["rollout_corr/staleness_max"] for r in records] == [0, 1, 1, 1]
    assert all(r["rollout_corr/is_weight_max"] > 0 for r in records)


def test_nothing_staler_than_the_bound_reaches_the_loss_under_a_slow_update(tmp_path, monkeypatch):
    seen = []
    update = LocalActorGroup.update

    def slow_update(self, batch, step):
        seen.append(int(((step - 1) - batch.weight_versions).max()))
        time.sleep(0.3)  # the producer runs ahead meanwhile, as far as the bound lets it
        return update(self, batch, step)

    monkeypatch.setattr(LocalActorGroup, "update", slow_update)
    run(tmp_path, "slow", "trainer.total_steps=5", "trainer.pipeline=async", "trainer.pipeline_options.max_staleness=2")
    assert seen == [0, 1, 2, 2, 2]


def test_tiny_sd3_one_step_off_samples_on_a_copy_and_corrects_with_step_weights(tmp_path):
    sd3 = [*TINY_SD3, "trainer.val_every=2", "algo.family_options.val_num_steps=4"]
    trainer, records = run(tmp_path, "sd3", "trainer.total_steps=2", "trainer.pipeline=one_step_off",
                           "algo.rollout_correction_options.level=step", base=sd3)
    assert trainer.rollout_engine.model is not trainer.model  # the update never changes the sampler's weights
    assert [r["rollout_corr/staleness_max"] for r in records] == [0, 1]
    # Step 2's samples are one version old: the weights between current and behaviour policy are not all 1.
    assert records[1]["rollout_corr/is_weight_max"] != 1.0
    assert (tmp_path / "sd3" / "samples" / "val_step_000002.png").is_file()


def test_async_makes_no_work_past_total_steps_and_a_longer_resume_repeats_the_straight_rewards(tmp_path):
    """async with max_staleness 2: the 2-step run holds no ticket or unit for step 3 or 4, yet
    resumed with 4 steps it samples what the straight 4-step run did (the same rewards, step by
    step, and the same weights at the end)."""
    from tests.omni_rl.trainer.test_pipeline import tickets_made

    pipelined = ["trainer.pipeline=async", "trainer.pipeline_options.max_staleness=2",
                 "algo.rollout_correction_options.level=token"]
    straight, records = run(tmp_path, "straight", "trainer.total_steps=4", *pipelined)
    short, first = run(tmp_path, "split", "trainer.total_steps=2", *pipelined)
    assert tickets_made(short.producer) <= {1, 2}
    state = json.loads((tmp_path / "split" / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert [index for index, _ in state["pipeline"]["units"]] == [3, 4]
    resumed, split = run(tmp_path, "split", "trainer.total_steps=4", f"trainer.resume={tmp_path / 'split'}", *pipelined)
    rest = [r for r in split if r["step"] > 2]  # the resumed run appends to the first part's metrics
    assert [r["reward/total/mean"] for r in first + rest] == [r["reward/total/mean"] for r in records]
    assert [r["rollout_corr/staleness_max"] for r in rest] == [r["rollout_corr/staleness_max"] for r in records[2:]]
    assert_same_weights(straight, resumed)

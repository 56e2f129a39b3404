"""Where the ratio's old log-probs come from (`PPOTrainer.old_policy`, algo.old_logprob_mode).

In one process the native diffusion engine samples with the trained model itself, so its
log-probs are the actor's: `auto` uses them and skips the recompute, except on check steps; the
text engine decodes with a KV cache, so `auto` recomputes there; a loss that reads the old
transition means gets them whatever the mode.
"""
import json

import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import TINY_SD3

SD3 = [*TINY_SD3, "trainer.total_steps=3"]


def train(tmp_path, name, *overrides, base=SD3):
    trainer = PPOTrainer(load_config([*base, f"trainer.output_dir={tmp_path / name}", *overrides]))
    scored = []
    forward = trainer.actors.behaviour_policy

    def counting(batch):  # a spy: counts the actor's behaviour-policy forwards, then runs them
        scored.append(len(batch))
        return forward(batch)

    trainer.actors.behaviour_policy = counting
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return trainer, records, scored


def test_auto_skips_the_recompute_between_checks_and_trains_like_recompute(tmp_path):
    auto, auto_records, auto_scored = train(tmp_path, "auto", "algo.logprob_check_every=2")
    full, full_records, full_scored = train(tmp_path, "recompute", "algo.old_logprob_mode=recompute")
    assert full_scored == [8, 8, 8]
    assert auto_scored == [8, 8]  # steps 1 and 3 are check steps; step 2 used the rollout's
    fractions = [r["rollout_corr/checked_fraction"] for r in auto_records]
    assert fractions == [1.0, 0.5, 1.0]  # step 2: its first mini-batch, 4 of 8 samples
    assert "rollout_corr/logprob_pearson" not in auto_records[1]
    for rec in auto_records:
        # The rollout's log-probs are the actor's: the ratio is 1 before the first update.
        assert rec["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6
        assert rec["rollout_corr/logprob_abs_diff_max"] <= 1e-5
    # Step 2's old log-probs are the rollout's (the engine's batch of 8 samples) in one run and the
    # actor's recompute (micro-batches of 2) in the other: the same function of the same inputs,
    # but BLAS may round by shape and CPU (1.4e-7 apart at step 3 on an Intel Xeon, equal on AMD
    # EPYC), and so may the update and what step 3 samples. Within 1e-6, as the weights below.
    auto_rewards, full_rewards = [r["reward/total/mean"] for r in auto_records], [r["reward/total/mean"] for r in full_records]
    assert auto_rewards == pytest.approx(full_rewards, rel=0, abs=1e-6)
    a, b = auto.model.named_trainable_tensors(), full.model.named_trainable_tensors()
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=0, msg=name)


def test_auto_recomputes_where_the_rollout_is_another_code_path(tmp_path):
    text = ["recipe=tiny_qwen3_grpo", "trainer.val_every=0", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]",
            "trainer.total_steps=2", "rollout.sampling_options.max_new_tokens=8"]
    _, records, scored = train(tmp_path, "text", base=text)
    assert len(scored) == 2  # KV-cached decoding is not the trainer's forward: every step recomputes
    assert all(r["rollout_corr/checked_fraction"] == 1.0 for r in records)


def test_a_loss_that_reads_the_old_means_gets_them_in_bypass(tmp_path):
    _, records, scored = train(tmp_path, "dppo", "algo.policy_loss=flow_dppo", "algo.old_logprob_mode=bypass",
                               "algo.logprob_check_every=0")
    assert scored == [8, 8, 8]  # the means need the forward even though the log-probs are the rollout's
    assert all("loss/dropfrac" in r for r in records)

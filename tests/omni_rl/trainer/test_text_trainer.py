"""The text path through the same PPO trainer, on the tiny Qwen3 (seconds per run)."""
import json

import pytest

from omni_rl.compose import load_config
from omni_rl.logging import rise_report
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import TINY_QWEN3

FAST = TINY_QWEN3


def run(tmp_path, name, *overrides):
    out = tmp_path / name
    PPOTrainer(load_config([*FAST, f"trainer.output_dir={out}", *overrides])).fit()
    return out, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_tiny_qwen3_recipe_learns_with_aligned_log_probs(tmp_path):
    out, records = run(tmp_path, "grpo")
    assert rise_report(out / "metrics.jsonl")["rose"]
    for rec in records:
        assert rec["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6
        assert rec["rollout_corr/logprob_abs_diff_max"] <= 1e-4
        assert rec["rollout_corr/logprob_pearson"] >= 0.999
        assert 0.0 <= rec["response/clip_ratio"] <= 1.0
    # Full fine-tuning exports the whole model with its tokenizer.
    assert (out / "model" / "config.json").is_file() and (out / "model" / "tokenizer_config.json").is_file()


@pytest.mark.parametrize("loss,extra", [
    ("gspo", ["algo.loss_options.gspo.clip_range=3e-4", "algo.loss_options.gspo.clip_range_high=4e-4"]),
    ("dapo", ["algo.loss_options.dapo.clip_range=0.2", "algo.loss_options.dapo.clip_range_high=0.28"]),
    ("cispo", []),
    ("sapo", []),
])
def test_every_token_loss_trains(tmp_path, loss, extra):
    _, records = run(tmp_path, loss, "trainer.total_steps=2", f"algo.policy_loss={loss}", *extra)
    assert records[-1]["actor/grad_norm"] > 0
    assert records[0]["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6


def test_the_verl_options_reach_the_loss(tmp_path):
    """Dual clip, Dr.GRPO's normalised aggregation and the KL clamp, set from the config, train."""
    _, records = run(tmp_path, "verl", "trainer.total_steps=2", "algo.loss_options.ppo_clip.clip_ratio_c=3.0",
                     "model.lora.enabled=true", "algo.loss_options.ppo_clip.loss_agg_mode=seq-mean-token-sum-norm",
                     "algo.kl_coef=0.05", "algo.loss_options.ppo_clip.kl_clamp=10")
    assert records[-1]["actor/grad_norm"] > 0
    assert all("loss/clipfrac_lower" in r and "loss/kl" in r for r in records)


def test_lora_with_kl_to_the_reference(tmp_path):
    out, records = run(tmp_path, "kl", "trainer.total_steps=2", "model.lora.enabled=true", "algo.kl_coef=0.05",
                       "algo.loss_options.ppo_clip.kl_estimator=k3")
    assert all(r["loss/kl"] >= 0 for r in records)
    assert (out / "lora" / "adapter_config.json").is_file()


def test_responses_over_the_limit_are_truncated_and_counted(tmp_path):
    _, records = run(tmp_path, "short", "trainer.total_steps=1", "algo.family_options.max_new_tokens=2")
    assert records[0]["response/clip_ratio"] > 0.5
    assert records[0]["response/length_max"] <= 2


def test_tiny_omni_recipe_trains_on_image_prompts(tmp_path):
    out = tmp_path / "omni"
    PPOTrainer(load_config(["recipe=tiny_qwen3_omni_gspo", f"trainer.output_dir={out}", "trainer.total_steps=2",
                            "trainer.val_every=0", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]"])).fit()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for rec in records:
        assert rec["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6
        assert rec["rollout_corr/logprob_abs_diff_max"] <= 1e-4
    assert (out / "lora" / "adapter_config.json").is_file()

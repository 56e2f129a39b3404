"""The text path through the same PPO trainer, on the tiny Qwen3 (seconds per run)."""
import json
import math

import pytest
import torch

from omni_rl.algos.token_losses import TokenLossInput
from omni_rl.compose import load_config
from omni_rl.logging import rise_report
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import TINY_QWEN3

FAST = TINY_QWEN3


def run(tmp_path, name, *overrides):
    out, records, _ = run_trainer(tmp_path, name, *overrides)
    return out, records


def run_trainer(tmp_path, name, *overrides):
    out = tmp_path / name
    trainer = PPOTrainer(load_config([*FAST, f"trainer.output_dir={out}", *overrides]))
    trainer.fit()
    return out, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], trainer


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


def test_every_token_loss_trains(tmp_path):
    # One step, its 32 samples one mini-batch, so every token is scored at the behaviour policy
    # (r = 1) and every loss sees the same rollout and advantages. There each loss's gradient is
    # known from ppo_clip's, -A d log_prob (REINFORCE) under the loss's aggregation:
    # - dapo is ppo_clip with token-mean: the same loss value and gradient;
    # - cispo's weight sg[clip(r)] is 1 and sapo's gate f has f'(1) = 1: the same gradient (their
    #   values, -A log_prob and -2A/tau, differ);
    # - gspo's sequence ratio s_i = 1 gives -A_i mean_t d log_prob: ppo_clip under
    #   seq-mean-token-mean, whose value, the mean of -A_i, is 0 (GRPO's advantages sum to 0 in a group).
    # The same gradient gives the same norm, and from the same weights the same AdamW step: the
    # first step moves each weight by lr * g / (|g| + eps), lr * sign(g) where g is not tiny, so a
    # gradient of the wrong sign would move every weight the other way.
    one = ["trainer.total_steps=1", "trainer.mini_batch_size=32", "trainer.val_every=0"]
    runs = {loss: run_trainer(tmp_path, loss, *one, *extra)[1:] for loss, extra in [
        ("ppo_clip", []),
        ("ppo_clip_seq", ["algo.policy_loss_options.ppo_clip.loss_agg_mode=seq-mean-token-mean"]),
        ("dapo", ["algo.policy_loss=dapo", "algo.policy_loss_options.dapo.clip_range=0.2", "algo.policy_loss_options.dapo.clip_range_high=0.28"]),
        ("cispo", ["algo.policy_loss=cispo"]),
        ("sapo", ["algo.policy_loss=sapo"]),
        ("gspo", ["algo.policy_loss=gspo", "algo.policy_loss_options.gspo.clip_range=3e-4", "algo.policy_loss_options.gspo.clip_range_high=4e-4"]),
    ]}
    rec = {loss: records[0] for loss, (records, _) in runs.items()}
    weights = {loss: trainer.actors.model.named_trainable_tensors() for loss, (_, trainer) in runs.items()}
    lr = 3e-3  # the recipe's optim.lr
    for loss, reference in [("dapo", "ppo_clip"), ("cispo", "ppo_clip"), ("sapo", "ppo_clip"), ("gspo", "ppo_clip_seq")]:
        assert rec[loss]["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6, loss
        assert rec[loss]["actor/grad_norm"] == pytest.approx(rec[reference]["actor/grad_norm"], rel=1e-3), loss
        moved = torch.cat([(weights[loss][n] - weights[reference][n]).abs().flatten() for n in weights[reference]])
        assert float((moved > lr / 2).float().mean()) < 0.01, loss  # opposite steps differ by 2 lr
    assert rec["ppo_clip"]["actor/grad_norm"] > 0
    assert rec["dapo"]["loss/policy"] == pytest.approx(rec["ppo_clip"]["loss/policy"], rel=1e-4, abs=1e-6)
    assert rec["gspo"]["loss/policy"] == pytest.approx(0.0, abs=1e-5)
    assert rec["ppo_clip_seq"]["loss/policy"] == pytest.approx(0.0, abs=1e-5)


def test_the_verl_options_reach_the_loss(tmp_path):
    """Dual clip, Dr.GRPO's normalised aggregation and the KL clamp, set from the config, reach
    the loss the actor trains with, which gives the values worked out below."""
    _, records, trainer = run_trainer(
        tmp_path, "verl", "trainer.total_steps=2", "algo.policy_loss_options.ppo_clip.clip_ratio_c=3.0",
        "model.lora.enabled=true", "algo.policy_loss_options.ppo_clip.loss_agg_mode=seq-mean-token-sum-norm",
        "algo.kl_coef=0.05", "algo.policy_loss_options.ppo_clip.kl_clamp=10")
    for rec in records:  # each micro-batch's total is its policy loss + kl_coef * KL, and so are their means
        assert rec["loss/total"] == pytest.approx(rec["loss/policy"] + 0.05 * rec["loss/kl"], rel=1e-5, abs=1e-7)
    loss = trainer.actors.family.policy_loss
    # Two sequences; the second's last token is padding. Token (0, 0) has ratio e^(ln 5) = 5 at
    # A = -1: PPO's max(-A r, -A clip(r, 0.8, 1.2)) = max(5, 1.2) = 5, which the dual clip caps at
    # -A c = 3. The other two tokens have r = 1: -A = 1 and -A = -1. seq-mean-token-sum-norm is
    # the sum over every token / (B C), C = loss_scale_factor, null here and so the recipe's
    # max_new_tokens = 16: policy = (3 + 1 - 1) / (2 * 16) = 3/32. The reference is 12 nats below
    # the policy at token (0, 0): k3 = e^-12 + 12 - 1 = 11.000006, clamped to 10, and 0 at the
    # others: KL = 10 / 32. total = 3/32 + 0.05 * 10/32 = 3.5/32.
    log_prob = torch.tensor([[-0.5, -1.0], [-2.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-0.5 - math.log(5.0), -1.0], [-2.0, 0.0]])
    ref = torch.tensor([[-12.5, -1.0], [-2.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    total, metrics = loss(TokenLossInput(log_prob=log_prob, old_log_prob=old, advantages=torch.tensor([[-1.0], [1.0]]),
                                         mask=mask, ref_log_prob=ref))
    assert float(metrics["policy_loss"]) == pytest.approx(3 / 32, rel=1e-6)
    assert float(metrics["kl"]) == pytest.approx(10 / 32, rel=1e-6)
    assert float(total.detach()) == pytest.approx(3.5 / 32, rel=1e-6)
    assert float(metrics["clipfrac_lower"]) == pytest.approx(1 / 3, rel=1e-6)  # 1 of the 3 tokens capped


def test_lora_with_kl_to_the_reference(tmp_path):
    # One step of two mini-batches, at kl_coef 0.05 and 0.1. LoRA's B starts at 0, so before the
    # first update the actor is its reference (LoRA off) exactly: k3 = e^x - x - 1 at x = ref - logp
    # = 0 is 0, and so is its gradient, 1 - e^x. The first update is then the policy loss's alone
    # at either coefficient, and the second mini-batch sees the same weights: the same KL k > 0
    # and policy loss p, with total = p + kl_coef * k.
    k3 = ["model.lora.enabled=true", "algo.policy_loss_options.ppo_clip.kl_estimator=k3", "trainer.total_steps=1"]
    out, (a,) = run(tmp_path, "kl", *k3, "algo.kl_coef=0.05")
    _, (b,) = run(tmp_path, "kl2", *k3, "algo.kl_coef=0.1")
    assert a["loss/kl"] > 0
    assert b["loss/kl"] == pytest.approx(a["loss/kl"], rel=1e-4)
    assert b["loss/policy"] == pytest.approx(a["loss/policy"], rel=1e-4, abs=1e-7)
    assert a["loss/total"] == pytest.approx(a["loss/policy"] + 0.05 * a["loss/kl"], rel=1e-5, abs=1e-7)
    assert b["loss/total"] == pytest.approx(b["loss/policy"] + 0.1 * b["loss/kl"], rel=1e-5, abs=1e-7)
    assert (out / "lora" / "adapter_config.json").is_file()


def test_responses_over_the_limit_are_truncated_and_counted(tmp_path):
    _, records = run(tmp_path, "short", "trainer.total_steps=1", "rollout.sampling_options.max_new_tokens=2")
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

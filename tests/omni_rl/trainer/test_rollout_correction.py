"""The rollout correction in the loop (`PPOTrainer.old_policy`, the families' losses): a no-op that
costs nothing where the rollout's log-probs are the old ones, and weights min(exp(old - rollout), C)
that reach the loss where the trainer recomputes them."""
import json
import math

import torch

from omni_rl.compose import load_config
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import QUIET, TINY_SD3

SD3 = [*TINY_SD3, "trainer.samples_per_prompt=2", "trainer.total_steps=2"]
TEXT = ["recipe=tiny_qwen3_grpo", "trainer.total_steps=1", "rollout.sampling_options.max_new_tokens=6", *QUIET]
UNIT = {"rollout_corr/is_weight_mean": 1.0, "rollout_corr/is_weight_max": 1.0, "rollout_corr/is_clipped_fraction": 0.0}


def build(tmp_path, name, *overrides):
    trainer = PPOTrainer(load_config([*overrides, f"trainer.output_dir={tmp_path / name}"]))
    seen = {"scored": [], "old": [], "batch": []}
    forward, old_policy = trainer.actors.behaviour_policy, trainer.old_policy

    def counting(batch):  # spies: the actor's behaviour-policy forwards, and what old_policy gave
        seen["scored"].append(len(batch))
        return forward(batch)

    def recording(batch, step, **options):
        out = old_policy(batch, step, **options)
        seen["old"].append(out)
        seen["batch"].append(batch)
        return out

    trainer.actors.behaviour_policy, trainer.old_policy = counting, recording
    return trainer, seen


def records(tmp_path, name):
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def policy_loss(family, micro, chunk, weights):
    micro.rollout_is_weights = weights
    with torch.no_grad():
        return family.loss(micro, chunk)[1]["loss/policy"]


def test_with_the_rollouts_own_log_probs_it_is_a_no_op_that_costs_nothing(tmp_path):
    on, seen = build(tmp_path, "on", *SD3, "algo.rollout_correction_options.level=step", "algo.logprob_check_every=0")
    on.fit()
    assert seen["scored"] == []  # the native engine is the actor's own model: nothing recomputed
    # No weights reach the loss, whose code path is then the one without the option.
    assert all(old.rollout_is_weights is None for old in seen["old"])
    for rec in records(tmp_path, "on"):
        assert {k: rec[k] for k in UNIT} == UNIT

    # The diffusion loss multiplies each (sample, step) term by its weight.
    micro = seen["batch"][-1].select([0, 1])
    plain = policy_loss(on.actors.family, micro, 1, None)
    torch.testing.assert_close(policy_loss(on.actors.family, micro, 1, torch.full((2, 2), 3.0)), 3 * plain)
    assert torch.equal(policy_loss(on.actors.family, micro, 1, torch.ones(2, 2)), plain)


def test_recomputed_old_log_probs_give_weights_that_reach_the_text_loss(tmp_path):
    trainer, seen = build(tmp_path, "text", *TEXT, "algo.rollout_correction_options.level=sequence", "algo.rollout_correction_options.cap=3.0")
    rollout = trainer.family.rollout

    def perturbed(*args, **kwargs):  # as if the engine had scored sample 0's first token 0.3 lower
        batch, futures = rollout(*args, **kwargs)
        batch.rollout_log_probs[0, 0] -= 0.3
        return batch, futures

    trainer.family.rollout = perturbed
    trainer.fit()
    assert len(seen["scored"]) == 1  # the text engine is another code path: the trainer recomputes
    old, batch = seen["old"][0], seen["batch"][0]
    mask = batch.response_mask.bool()
    gap = ((old.log_probs - batch.rollout_log_probs) * mask).sum(1)  # per sequence, 0.3 + ~0 for row 0
    expected = torch.clamp(torch.exp(gap.double()), max=3.0).float()[:, None].expand_as(mask) * mask
    torch.testing.assert_close(old.rollout_is_weights, expected)
    assert abs(float(old.rollout_is_weights[0, 0]) - math.exp(0.3)) < 1e-3
    (rec,) = records(tmp_path, "text")
    assert abs(rec["rollout_corr/is_weight_max"] - math.exp(0.3)) < 1e-3
    assert rec["rollout_corr/is_clipped_fraction"] == 0.0
    assert rec["rollout_corr/is_weight_mean"] > 1.0

    # The token loss multiplies each token's term by its weight.
    micro = batch.select([0, 1])
    plain = policy_loss(trainer.actors.family, micro, 0, None)
    torch.testing.assert_close(policy_loss(trainer.actors.family, micro, 0, 2 * micro.response_mask), 2 * plain)

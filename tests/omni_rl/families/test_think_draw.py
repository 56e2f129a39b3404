"""The think-draw family (omni_rl/families/think_draw.py) with BAGEL's think stage on `tiny:bagel`:
one trajectory of plan tokens then image steps, through the unchanged `PPOTrainer`.

One step's rollout-vs-trainer checks hold on both kinds of action (the first mini-batch's ratio
is exactly 1; the rollout's log-probs are the trainer's within 1e-5, plan columns and image
columns each), one update moves both the understanding-side and the generation-side LoRA, a
resumed run repeats the straight one, and the config refuses losses of the wrong kind."""
import json

import pytest
import torch

from omni_rl.algos.token_losses import TOKEN_LOSSES
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.families.think_draw import ThinkDrawOptions
from omni_rl.trainer import PPOTrainer

SMALL = [
    "recipe=tiny_bagel_think_flowgrpo", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
    "trainer.mini_batch_size=4", "trainer.micro_batch_size=2", "rollout.sampling_options.num_steps=3", "rollout.sampling_options.sde_window_size=2",
    "rollout.sampling_options.sde_window_range=[0,3]", "rollout.sampling_options.max_new_tokens=4", "trainer.val_every=0", "trainer.logger_options.progress_bar=false",
    "trainer.loggers=[jsonl]",
]


def trainer_for(tmp_path, name, *overrides):
    return PPOTrainer(load_config([*SMALL, f"trainer.output_dir={tmp_path / name}", *overrides]))


def lora_b(model, side):
    """The LoRA B matrices of one expert: "und" (understanding) or "gen" (generation)."""
    return {n: p.detach().clone() for n, p in model.network.named_parameters()
            if "lora_B" in n and ("_moe_gen" in n) == (side == "gen")}


def test_one_step_is_on_policy_on_both_kinds_of_action_and_trains_both_experts(tmp_path):
    trainer = trainer_for(tmp_path, "run", "trainer.total_steps=1", "algo.old_logprob_mode=recompute")
    try:
        before = {side: lora_b(trainer.model, side) for side in ("und", "gen")}
        assert all(float(t.abs().max()) == 0 for side in before.values() for t in side.values())  # B starts at 0
        batch, _ = trainer.family.rollout(trainer.rollout_engine, trainer.sampler.prompts_for_step(0), 1)
        r = batch.plan_width
        assert batch.rollout_log_probs.shape == (4, r + 2) and r == 4
        assert all("plan" in m for m in batch.metadata)
        scored = trainer.actors.behaviour_policy(batch)
        assert torch.equal(scored.mask[:, :r], batch.plan_mask) and bool((scored.mask[:, r:] == 1).all())
        valid = batch.plan_mask.bool()
        plan_gap = (scored.log_probs[:, :r] - batch.rollout_log_probs[:, :r]).abs()[valid]
        image_gap = (scored.log_probs[:, r:] - batch.rollout_log_probs[:, r:]).abs()
        assert float(plan_gap.max()) <= 1e-5 and float(image_gap.max()) <= 1e-5
        metrics = trainer.train_step(1)
        assert metrics["actor/first_minibatch_ratio_max_abs_dev"] == 0.0
        assert metrics["loss/plan_ratio_max_abs_dev"] == 0.0
        assert metrics["rollout_corr/logprob_abs_diff_max"] <= 1e-5
        after = {side: lora_b(trainer.model, side) for side in ("und", "gen")}
        for side in ("und", "gen"):  # one update reached both experts
            assert any(float(t.abs().max()) > 0 for t in after[side].values()), side
    finally:
        trainer.actors.close()


def test_a_resumed_run_repeats_the_straight_one(tmp_path):
    def run(name, *overrides):
        trainer = trainer_for(tmp_path, name, *overrides)
        trainer.fit()
        return trainer

    straight = run("straight", "trainer.total_steps=2")
    run("split", "trainer.total_steps=1", "trainer.save_every=1")
    resumed = run("split", "trainer.total_steps=2", f"trainer.resume={tmp_path / 'split'}")
    a, b = straight.model.named_trainable_tensors(), resumed.model.named_trainable_tensors()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    records = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["response/plan_length_mean"] for r in records if "response/plan_length_mean" in r]


@pytest.mark.parametrize("override, key", [
    ("algo.family_options.plan_policy_loss=flow_grpo", "algo.family_options.plan_policy_loss='flow_grpo'"),
    ("algo.family_options.plan_policy_loss=nope", "algo.family_options.plan_policy_loss='nope'"),
    ("algo.policy_loss=ppo_clip", "algo.policy_loss='ppo_clip'"),
    ("algo.policy_loss=flow_dppo", "algo.policy_loss='flow_dppo'"),
    ("algo.policy_loss=diffusion_nft", "algo.policy_loss='diffusion_nft'"),
    ("algo.rollout_correction_options.level=step", "algo.rollout_correction_options.level='step'"),
    ("trainer.pipeline=one_step_off", "trainer.pipeline='one_step_off'"),
    ("rollout.sampling_options.top_p=0.9", "rollout.sampling_options.top_p=0.9"),
    ("rollout.backend=server", "rollout.backend='server'"),
])
def test_a_loss_of_the_wrong_kind_is_a_config_error_naming_it(tmp_path, override, key):
    with pytest.raises(ConfigError, match=key.replace("(", r"\(")):
        load_config([*SMALL, f"trainer.output_dir={tmp_path}", override])


def test_the_plan_keys_have_their_defaults_in_the_schema(tmp_path):
    # The think_draw family's options as a recipe without a plan block gets them (its defaults).
    options = ThinkDrawOptions()
    plan_clip_range = TOKEN_LOSSES.get(options.plan_policy_loss).Options().clip_range
    assert (options.plan_policy_loss, plan_clip_range, options.plan_loss_weight) == ("ppo_clip", 0.2, 1.0)

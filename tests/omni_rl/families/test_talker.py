"""The talker family (omni_rl/families/talker.py) with `model.stage=thinker_talker` on
`tiny:qwen3_omni_talker`: one loss on one trajectory (the answer's tokens, then the frames) trains
both halves, and each half's update is the one its own stage would make on the same samples.

What "the one its own stage would make" means, exactly. On-policy (ratio 1) a token loss's
gradient is a weighted sum of the actions' log-prob gradients, each weighted by its sample's
advantage over the loss's denominator. The answer's log-probs do not depend on the talker, and the
frames' do not depend on the thinker's weights (the talker reads the answer's embeddings without
gradient), so the joint gradient splits into a thinker part and a talker part. They differ from
`model.stage=thinker`'s and `model.stage=talker`'s only in the denominator:
- `ppo_clip`, token-mean: all the trajectory's actions, R tokens + F frames, instead of one half's;
  one factor for the whole batch, so each half moves in exactly the direction of its own stage;
- `gspo`, seq-mean-token-mean: sample i's own R_i + F_i, instead of R_i or F_i; each half moves
  as its own stage would with sample i's advantage weighted by that half's share of the
  trajectory (R_i / (R_i + F_i), or F_i / (R_i + F_i)).
The test runs each stage's own family code on the joint rollout's samples and checks both.
"""
from dataclasses import replace

import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.trainer import PPOTrainer

SMALL = [
    "recipe=tiny_qwen3_omni_talker_grpo", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
    "trainer.mini_batch_size=4", "trainer.micro_batch_size=4", "rollout.sampling_options.max_new_tokens=4",
    "rollout.sampling_options.max_frames=6", "trainer.val_every=0", "trainer.loggers=[jsonl]",
    "trainer.logger_options.progress_bar=false",
]
# The thinker stage speaks nothing: the talker's options and the audio reward are not its own (the
# reward does not enter: every loss below is given its advantages).
THINKER_ONLY = ["model.stage=thinker", "~model.adapter_options.trainable", "~rollout.sampling_options.speech_temperature",
                "~rollout.sampling_options.max_frames", "reward.rewards=[{name: char_match, weight: 1.0}]"]


def trainer_for(tmp_path, name, *overrides):
    return PPOTrainer(load_config([*SMALL, f"trainer.output_dir={tmp_path / name}", *overrides]))


def half(grads: dict[str, torch.Tensor], part: str) -> torch.Tensor:
    return torch.cat([g.flatten() for n, g in sorted(grads.items()) if n.startswith(f"{part}:")])


def assert_proportional(joint: torch.Tensor, alone: torch.Tensor, factor: float | None) -> None:
    assert alone.abs().max() > 0 and joint.abs().max() > 0  # the half is trained at all
    expected = alone * factor if factor is not None else alone
    assert (joint - expected).norm() <= 1e-4 * expected.norm(), float((joint - expected).norm() / expected.norm())


@pytest.mark.parametrize("loss", ["ppo_clip", "gspo"])
def test_each_half_of_thinker_talker_trains_as_its_own_stage_would(tmp_path, loss):
    loss_override = [f"algo.policy_loss={loss}"]
    joint = trainer_for(tmp_path, "joint", "model.stage=thinker_talker", *loss_override)
    talker = trainer_for(tmp_path, "talker", "model.stage=talker", *loss_override)
    thinker = trainer_for(tmp_path, "thinker", *THINKER_ONLY, *loss_override)
    try:
        torch.manual_seed(0)
        batch, _ = joint.family.rollout(joint.rollout_engine, joint.sampler.prompts_for_step(0), 1)
        n, r = len(batch), batch.answer_width
        old = joint.family.behaviour_policy(batch, n).log_probs
        advantages = torch.tensor([1.0, -0.5, 0.75, -1.25])[:n]
        batch = replace(batch, advantages=advantages, old_log_probs=old)
        tokens, frames = batch.text.response_mask.sum(1), batch.frame_mask.sum(1)
        assert bool((tokens > 0).all() and (frames > 0).all())

        g_joint = named_grads_after(joint, batch)
        assert {n.split(":")[0] for n in g_joint} == {"thinker", "talker"}

        if loss == "ppo_clip":  # one factor for the batch: each half's share of all actions
            total = float(tokens.sum() + frames.sum())
            scale_text, scale_speech = float(tokens.sum()) / total, float(frames.sum()) / total
            text_adv, speech_adv = advantages, advantages
        else:  # a factor per sample: its half's share of its own trajectory
            scale_text = scale_speech = None
            text_adv = advantages * tokens / (tokens + frames)
            speech_adv = advantages * frames / (tokens + frames)

        text = replace(batch.text, advantages=text_adv, old_log_probs=old[:, :r])
        g_thinker = named_grads_after(thinker, text, "thinker")
        speech = replace(batch, trains_thinker=False, advantages=speech_adv, old_log_probs=old[:, r:])
        g_talker = named_grads_after(talker, speech, "talker")

        assert {k for k in g_joint if k.startswith("thinker:")} == set(g_thinker)
        assert {k for k in g_joint if k.startswith("talker:")} == set(g_talker)
        assert_proportional(half(g_joint, "thinker"), half(g_thinker, "thinker"), scale_text)
        assert_proportional(half(g_joint, "talker"), half(g_talker, "talker"), scale_speech)
    finally:
        for t in (joint, talker, thinker):
            t.actors.close()


def named_grads_after(trainer, batch, part: str | None = None) -> dict[str, torch.Tensor]:
    """The gradient of the trainer's own family loss on `batch`, as {"part:parameter": grad}. A
    one-stage model's one trainable module is named `part` (the joint model names its two)."""
    modules = trainer.model.trainable_modules()
    if part is not None:
        (module,) = modules.values()
        modules = {part: module}
    for module in modules.values():
        module.zero_grad(set_to_none=True)
    loss, _ = trainer.actors.family.loss(batch, 0)  # the training family (the driver's does not train)
    loss.backward()
    return {f"{name}:{n}": torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
            for name, module in modules.items() for n, p in module.named_parameters() if p.requires_grad}

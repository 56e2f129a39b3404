"""DanceGRPO's per-sample subset of trained steps (`algo.family_options.timestep_fraction`, DiffusionFamily.trained_steps).

Every step is stochastic (`rollout.sampling_options.sde_window_size=0`, the dance_sde kernel); each sample trains
int(W * fraction) of them, drawn from its own seed: the same subset on a rerun (so a resumed
run trains what the uninterrupted one did), different subsets across samples, and the stored
latents, sigmas and log-probs of exactly those steps (the first mini-batch's ratio is 1).
"""
import json

import torch

from omni_rl.compose import load_config
from omni_rl.trainer import PPOTrainer

DANCE = [
    "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4", "trainer.mini_batch_size=8",
    "trainer.micro_batch_size=4", "rollout.sampling_options.num_steps=6", "rollout.sampling_options.sde_window_size=0", "rollout.sampling_options.kernel=dance_sde",
    "rollout.sampling_options.noise_level=0.3", "rollout.sampling_options.sde_window_range=null", "algo.family_options.same_noise_in_group=true", "algo.family_options.timestep_fraction=0.6",
    "trainer.val_every=0", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", "trainer.total_steps=2",
]


def test_each_sample_trains_its_own_seeded_subset_of_steps(tmp_path):
    trainer = PPOTrainer(load_config([*DANCE, f"trainer.output_dir={tmp_path / 'run'}"]))
    try:
        prompts = trainer.sampler.prompts_for_step(0)
        batch, _ = trainer.family.rollout(trainer.rollout_engine, prompts, step=1)
        again, _ = trainer.family.rollout(trainer.rollout_engine, prompts, step=1)
    finally:
        trainer.actors.close()
    assert batch.step_index.shape == (8, 3)  # int(6 * 0.6) of the 6 stochastic steps
    assert batch.num_train_steps == 3 and batch.rollout_log_probs.shape == (8, 3)
    assert torch.equal(batch.step_index, again.step_index)
    assert torch.equal(batch.step_index, batch.step_index.sort(dim=1).values)
    assert len({tuple(row) for row in batch.step_index.tolist()}) > 1  # not one subset for all
    # Each trained step's inputs are that step's stored latents and sigmas.
    rows = torch.arange(8)
    x, x_next = batch.step_latents(1)
    assert torch.equal(x, batch.latents[rows, batch.step_index[:, 1]])
    assert torch.equal(x_next, batch.latents[rows, batch.step_index[:, 1] + 1])
    full = trainer.model.sigmas(6)
    assert torch.equal(batch.sigmas, full[batch.step_index])
    # Shared initial noise per group (DanceGRPO): a group's samples start from one latent.
    assert torch.equal(batch.latents[0, 0], batch.latents[3, 0]) and not torch.equal(batch.latents[0, 0], batch.latents[4, 0])


def test_training_on_the_subset_is_on_policy(tmp_path):
    trainer = PPOTrainer(load_config([*DANCE, f"trainer.output_dir={tmp_path / 'run'}", "algo.old_logprob_mode=recompute"]))
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for rec in records:
        assert rec["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6
        assert rec["rollout_corr/logprob_abs_diff_max"] <= 1e-5


def test_a_resumed_two_expert_dance_run_trains_what_the_straight_one_did(tmp_path):
    """DanceGRPO on the two-expert Wan (both experts' LoRA in the checkpoint): 2 steps, resume,
    2 more equals 4 straight, since the trained-step subsets are drawn from the samples' seeds."""
    wan = ["recipe=tiny_wan22_dancegrpo", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4",
           "trainer.mini_batch_size=4", "trainer.micro_batch_size=4", "rollout.sampling_options.num_steps=4",
           "trainer.val_every=0", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]"]

    def run(name, *overrides):
        trainer = PPOTrainer(load_config([*wan, f"trainer.output_dir={tmp_path / name}", *overrides]))
        trainer.fit()
        return trainer

    straight = run("straight", "trainer.total_steps=4")
    run("split", "trainer.total_steps=2", "trainer.save_every=2")
    resumed = run("split", "trainer.total_steps=4", f"trainer.resume={tmp_path / 'split'}")
    a, b = straight.model.named_trainable_tensors(), resumed.model.named_trainable_tensors()
    assert a.keys() == b.keys() and {k.split(".")[0] for k in a} == {"transformer", "transformer_2"}
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=0, msg=name)
    assert any(float(t.abs().max()) > 0 for n, t in a.items() if "lora_B" in n)

"""The forward-process losses through the trainer on the tiny SD3 (CPU, seconds per run): ODE
rollouts, finite losses, the LoRA moves, DiffusionNFT's EMA lags the weights and resumes
exactly from a checkpoint, Diffusion-DPO counts its pairs."""
import json
import math

import torch

from omni_rl.compose import load_config
from omni_rl.trainer import PPOTrainer

SMALL = [
    "trainer.prompts_per_step=2",
    "trainer.samples_per_prompt=4",
    "trainer.micro_batch_size=2",
    "rollout.sampling_options.num_steps=4",
    "trainer.val_every=0",
    "trainer.logger_options.progress_bar=false",
    "trainer.loggers=[jsonl]",
]


def run(tmp_path, recipe, name, *overrides):
    cfg = load_config([f"recipe={recipe}", *SMALL, f"trainer.output_dir={tmp_path / name}", *overrides])
    trainer = PPOTrainer(cfg)
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return trainer, records


def lora_b_moved(trainer) -> bool:
    return any(float(t.abs().max()) > 0 for n, t in trainer.model.named_trainable_tensors().items() if "lora_B" in n)


def test_nft_trains_and_resumes_its_ema_exactly(tmp_path):
    nft = ("tiny_sd3_diffusion_nft", "trainer.mini_batch_size=4")
    straight, records = run(tmp_path, nft[0], "straight", nft[1], "trainer.total_steps=3")
    for rec in records:
        for key in ("loss/policy", "loss/nft_positive", "loss/nft_negative", "loss/nft_r_mean"):
            assert math.isfinite(rec[key]), key
        assert rec["actor/num_updates"] == 2
    assert records[-1]["loss/nft_old_gap"] > 0  # the EMA lags the weights once they moved
    assert lora_b_moved(straight)
    ema = straight.actors.family.ema
    weights = straight.model.named_trainable_tensors()
    assert any(not torch.equal(ema.shadow[n], weights[n]) for n in weights)

    run(tmp_path, nft[0], "split", nft[1], "trainer.total_steps=2")
    resumed, _ = run(tmp_path, nft[0], "split", nft[1], "trainer.total_steps=3", f"trainer.resume={tmp_path / 'split'}")
    resumed_weights = resumed.model.named_trainable_tensors()
    resumed_ema = resumed.actors.family.ema.shadow
    for name in weights:
        torch.testing.assert_close(resumed_weights[name], weights[name], atol=1e-6, rtol=0, msg=name)
        torch.testing.assert_close(resumed_ema[name], ema.shadow[name], atol=1e-6, rtol=0, msg=name)


def test_dpo_trains_on_best_vs_worst_pairs(tmp_path):
    trainer, records = run(tmp_path, "tiny_sd3_diffusion_dpo", "dpo", "trainer.mini_batch_size=2",
                           "trainer.micro_batch_size=1", "trainer.total_steps=2")
    for rec in records:
        assert rec["actor/dpo_pairs"] + rec["actor/dpo_tied_groups"] == 2
        assert rec["actor/dpo_pairs"] >= 1  # brightness of random images does not tie
        for key in ("loss/policy", "loss/dpo_accuracy", "loss/dpo_margin", "loss/dpo_err_winner"):
            assert math.isfinite(rec[key]), key
    # Before any update the policy is the reference: the loss is log 2 on the first mini-batch.
    # (LoRA's B starts at 0, so the LoRA-on and the LoRA-off forwards agree exactly.)
    assert abs(records[0]["loss/policy"] - math.log(2)) < 1e-6
    assert lora_b_moved(trainer)


def test_the_driver_holds_no_second_training_half(tmp_path):
    """With DiffusionNFT the EMA (and the loss) exist once, where the weights are trained: the
    driver's family samples and scores only."""
    cfg = load_config(["recipe=tiny_sd3_diffusion_nft", *SMALL, "trainer.mini_batch_size=4",
                       f"trainer.output_dir={tmp_path / 'one'}"])
    trainer = PPOTrainer(cfg)
    try:
        assert trainer.family.ema is None and trainer.family.policy_loss is None
        assert trainer.actors.family.ema is not None and trainer.actors.family.policy_loss is not None
    finally:
        trainer.actors.close()

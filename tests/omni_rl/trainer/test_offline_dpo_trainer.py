"""Offline Diffusion-DPO through the trainer (`data.preference_file`) on the tiny SD3: each step
trains the file's pairs without a rollout, the first loss is log 2 (the policy is the reference),
the LoRA moves, a resumed run ends with the uninterrupted run's weights, the step's pairs are
the same whatever came before, and bad input fails at load naming the key or the row."""
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.cli import main as cli_main
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.families.offline_pairs import OfflinePairs
from omni_rl.models.factory import build_model
from omni_rl.trainer import PPOTrainer

OFFLINE = [
    "recipe=tiny_sd3_diffusion_dpo",
    "data.prompts=null",
    "trainer.pipeline=offline_pairs",
    "trainer.prompts_per_step=4",
    "trainer.samples_per_prompt=1",
    "trainer.mini_batch_size=2",
    "trainer.micro_batch_size=1",
    "algo.family_options.forward_num_timesteps=1",
    "trainer.val_every=0",
    "trainer.logger_options.progress_bar=false",
    "trainer.loggers=[jsonl]",
]


def pairs_file(folder, n=6):
    """n pairs: a bright image preferred to a dark one, each prompt its own."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        for name, base in (("w", 200), ("l", 50)):
            pixels = np.clip(base + rng.integers(-30, 30, (32, 32, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}_{name}.png")
        rows.append({"prompt": f"picture {i}", "chosen": f"{i}_w.png", "rejected": f"{i}_l.png"})
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(tmp_path, name, *overrides):
    cfg = load_config([*OFFLINE, f"data.preference_file={pairs_file(tmp_path / 'pairs')}",
                       f"trainer.output_dir={tmp_path / name}", *overrides])
    trainer = PPOTrainer(cfg)
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return trainer, records


def test_offline_pairs_train_without_a_rollout_and_resume_exactly(tmp_path):
    straight, records = run(tmp_path, "straight", "trainer.total_steps=3")
    assert [r["step"] for r in records] == [1, 2, 3]
    for rec in records:
        assert rec["actor/dpo_pairs"] == 4 and rec["actor/num_updates"] == 2
        assert "timing/rollout" not in rec and "reward/total/mean" not in rec
        for key in ("loss/policy", "loss/dpo_accuracy", "loss/dpo_margin", "timing/encode_pairs"):
            assert math.isfinite(rec[key]), key
    # Before the first update the policy is the reference (LoRA B = 0): the DPO loss is log 2 on
    # the first mini-batch; the step's mean includes the second, after one update.
    assert records[0]["loss/policy"] < math.log(2) + 1e-6
    weights = straight.model.named_trainable_tensors()
    assert any(float(t.abs().max()) > 0 for n, t in weights.items() if "lora_B" in n)

    run(tmp_path, "split", "trainer.total_steps=2")
    resumed, _ = run(tmp_path, "split", "trainer.total_steps=3", f"trainer.resume={tmp_path / 'split'}")
    for name, tensor in resumed.model.named_trainable_tensors().items():
        torch.testing.assert_close(tensor, weights[name], atol=1e-6, rtol=0, msg=name)


def test_a_step_trains_the_same_pairs_whatever_came_before(tmp_path):
    cfg = load_config([*OFFLINE, f"data.preference_file={pairs_file(tmp_path)}"])
    model = build_model(cfg.model, torch.device("cpu"))
    first, again = OfflinePairs(cfg, model), OfflinePairs(cfg, model)
    order = [[r.prompt for r in first.rows_for_step(s)] for s in (1, 2, 3)]
    assert order == [[r.prompt for r in again.rows_for_step(s)] for s in (3, 2, 1)][::-1]
    # 6 pairs, 4 a step: step 1 and the first two of step 2 are epoch 0, a permutation of all six.
    assert sorted(order[0] + order[1][:2]) == sorted(f"picture {i}" for i in range(6))
    step2, step2_again = first.batch(2), again.batch(2)
    assert step2.prompts == order[1]
    torch.testing.assert_close(step2.chosen, step2_again.chosen, atol=0, rtol=0)
    assert torch.equal(step2.seeds, step2_again.seeds)
    assert not set(step2.seeds.tolist()) & set(first.batch(3).seeds.tolist())  # fresh (t, eps) each step


@pytest.mark.parametrize("override, message", [
    ("algo.policy_loss=diffusion_nft", "algo.policy_loss='diffusion_nft': expected diffusion_dpo with data.preference_file"),
    ("data.prompts=[a cat]", "data.prompts=['a cat']: expected null with data.preference_file"),
    ("trainer.samples_per_prompt=2", "trainer.samples_per_prompt=2: expected 1 with data.preference_file"),
    ("trainer.pipeline=one_step_off", "trainer.pipeline='one_step_off': expected offline_pairs with data.preference_file"),
    ("trainer.pipeline=on_policy", "trainer.pipeline='on_policy': expected offline_pairs with data.preference_file"),
])
def test_inconsistent_offline_configs_fail_at_load(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config([*OFFLINE, f"data.preference_file={pairs_file(tmp_path)}", override])


def test_offline_pairs_without_a_preference_file_fail_at_load():
    with pytest.raises(ConfigError, match=r"trainer.pipeline='offline_pairs': expected a data.preference_file"):
        load_config(["recipe=tiny_sd3_diffusion_dpo", "trainer.pipeline=offline_pairs"])


def test_a_bad_row_stops_the_command_before_any_model_loads(tmp_path, capsys):
    path = pairs_file(tmp_path)
    path.write_text(path.read_text() + json.dumps({"prompt": "x", "chosen": "0_w.png", "rejected": "gone.png"}) + "\n")
    code = cli_main([*OFFLINE, f"data.preference_file={path}", f"trainer.output_dir={tmp_path / 'out'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "pairs.jsonl, row 7: field 'rejected'" in err and "gone.png is not a file" in err
    assert not (tmp_path / "out" / "metrics.jsonl").exists()

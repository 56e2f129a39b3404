"""The held-out alarm: hand-worked updates, and a run whose held-out reward is the proxy's opposite."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from omni_rl.logging.heldout_alarm import AlarmOptions, HeldoutAlarm

ROOT = Path(__file__).resolve().parents[3]


def val(mean, std):
    return {"val/reward/total/mean": mean, "val/reward/total/std": std}


def test_it_fires_when_the_heldout_falls_past_the_bound_while_the_training_reward_rises():
    alarm = HeldoutAlarm(AlarmOptions(alarm_sigmas=2.0))
    for r in (0.1, 0.2):
        alarm.observe_train({"reward/total/mean": r})
    # First validation: the best so far (training mean over its window 0.15).
    metrics, warning = alarm.update(10, val(0.60, 0.4), num_samples=16)
    assert warning is None and metrics["alarm/heldout_best"] == 0.60 and metrics["alarm/reward_hacking"] == 0.0
    for r in (0.3, 0.5):
        alarm.observe_train({"reward/total/mean": r})
    # se = 0.4 / sqrt(16) = 0.1 both times: spread = sqrt(0.1^2 + 0.1^2) = 0.1414; a fall of 0.2
    # is 1.41 se, under 2: no alarm although the training mean rose 0.15 -> 0.4.
    metrics, warning = alarm.update(20, val(0.40, 0.4), num_samples=16)
    assert warning is None and metrics["alarm/heldout_drop_se"] == pytest.approx(0.2 / math.hypot(0.1, 0.1))
    assert metrics["alarm/train_rise_since_best"] == pytest.approx(0.25)
    for r in (0.6, 0.7):
        alarm.observe_train({"reward/total/mean": r})
    # A fall of 0.4 is 2.83 se, and training rose 0.15 -> 0.65: it fires, naming both curves.
    metrics, warning = alarm.update(30, val(0.20, 0.4), num_samples=16)
    assert metrics["alarm/reward_hacking"] == 1.0
    assert "fell from 0.6 (step 10) to 0.2 (step 30)" in warning and "rose from 0.15 to 0.65" in warning


def test_a_fall_with_a_falling_training_reward_is_no_alarm_and_a_new_best_resets():
    alarm = HeldoutAlarm(AlarmOptions())
    alarm.observe_train({"reward/total/mean": 0.9})
    alarm.update(1, val(0.8, 0.1), 100)
    alarm.observe_train({"reward/total/mean": 0.2})  # both fall: the policy got worse, not hacky
    metrics, warning = alarm.update(2, val(0.1, 0.1), 100)
    assert warning is None and metrics["alarm/reward_hacking"] == 0.0 and metrics["alarm/heldout_drop_se"] > 2
    metrics, _ = alarm.update(3, val(0.95, 0.1), 100)
    assert metrics["alarm/heldout_best"] == 0.95 and metrics["alarm/heldout_drop_se"] == 0.0


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="alarm_sigmas"):
        AlarmOptions(alarm_sigmas=float("inf")).check()
    with pytest.raises(ValueError, match="alarm_heldout_metric"):
        AlarmOptions(alarm_heldout_metric="val/reward/total/std").check()


HACKED = ["recipe=tiny_sd3_flowgrpo", "trainer.total_steps=8", "trainer.val_every=2", "trainer.save_every=0",
          "trainer.val_num_prompts=2", "trainer.val_samples_per_prompt=4",
          # The held-out measure is the proxy's opposite: the darker, the better. As the policy learns
          # the brightness it is rewarded for, the held-out score must fall.
          "reward.val_rewards=[{name: brightness, weight: -1.0}]",
          "optim.lr=0.05"]  # the recipe's 3e-3 needs its 80 steps to learn brightness; 0.05 does in 8


def test_a_run_that_hacks_its_proxy_raises_the_alarm_and_stops_only_when_asked(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "main_omni.py", *HACKED, f"trainer.output_dir={out}",
                           "trainer.logger_options.alarm_stop=true"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    hacked = [r for r in rows if r.get("alarm/reward_hacking") == 1.0]
    assert hacked, f"no alarm in {[(r.get('step'), r.get('val/reward/total/mean'), r.get('reward/total/mean')) for r in rows]}"
    assert done.returncode == 1 and "held-out val/reward/total/mean fell from" in done.stderr, done.stderr[-2000:]
    assert "alarm_stop" in done.stderr and (out / "checkpoints").is_dir()

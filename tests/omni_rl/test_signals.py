"""SIGTERM / SIGINT mid-run: the step is finished and saved, one line says where, and a run
resumed from that checkpoint ends with the uninterrupted run's weights.

Each test runs `python main_omni.py` (the tiny Qwen3) in a subprocess and acts when the run's
own files say it is far enough (metrics.jsonl lines, a marker the reward writes), never after
a fixed sleep; the timeouts are sized for a machine several times slower than a loaded laptop.
"""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from omni_rl.compose import load_config
from omni_rl.trainer import PPOTrainer
from omni_rl.trainer.checkpoint import list_checkpoints, load_checkpoint
from tests.tiny_runs import TINY_QWEN3

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = Path(__file__).resolve().parent / "plugins_for_tests"
FAST = TINY_QWEN3
TIMEOUT_S = 600


def start(tmp_path, name, *overrides, env=None):
    log = open(tmp_path / f"{name}.stderr", "w")
    proc = subprocess.Popen(
        [sys.executable, "main_omni.py", *FAST, f"trainer.output_dir={tmp_path / name}", *overrides],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **(env or {})},
    )
    proc.stderr_path = tmp_path / f"{name}.stderr"
    return proc


def wait_for(proc, ready, what):
    deadline = time.monotonic() + TIMEOUT_S
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}: {proc.stderr_path.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within {TIMEOUT_S} s")
        time.sleep(0.05)


def metrics_lines(out):
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def error_lines(proc):
    text = proc.stderr_path.read_text()
    assert "Traceback" not in text, text[-3000:]
    return [line for line in text.splitlines() if line.startswith("error: ")]


def test_sigterm_saves_the_step_reached_and_resuming_matches_the_uninterrupted_run(tmp_path):
    out = tmp_path / "cut"
    proc = start(tmp_path, "cut", "trainer.total_steps=40")  # far more steps than it will live
    wait_for(proc, lambda: metrics_lines(out) >= 2, "two logged steps")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=TIMEOUT_S) == 143

    (line,) = error_lines(proc)
    match = re.fullmatch(r"error: interrupted by SIGTERM at step (\d+); checkpoint saved to (\S+) "
                         r"\(resume with trainer\.resume=(\S+)\)", line)
    assert match, line
    step, checkpoint = int(match.group(1)), Path(match.group(2))
    assert 2 <= step < 40 and match.group(3) == str(checkpoint)
    assert checkpoint == out / "checkpoints" / f"step_{step:06d}" and list_checkpoints(out) == [checkpoint]
    assert load_checkpoint(str(checkpoint))["step"] == step
    assert metrics_lines(out) == step

    # The default save_every=0 saves only at the end: the signal's checkpoint is the only one.
    end = f"trainer.total_steps={step + 1}"
    PPOTrainer(load_config([*FAST, f"trainer.output_dir={out}", end, f"trainer.resume={checkpoint}"])).fit()
    PPOTrainer(load_config([*FAST, f"trainer.output_dir={tmp_path / 'straight'}", end])).fit()
    resumed = load_file(out / "model" / "model.safetensors")
    straight = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    assert resumed.keys() == straight.keys() and resumed
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], atol=1e-6, rtol=0, msg=name)
    start_weights = load_file(checkpoint / "model" / "model.safetensors")
    assert any(not torch.equal(start_weights[k], straight[k]) for k in straight)  # the last step trained


def test_sigint_saves_and_exits_130_with_one_line(tmp_path):
    out = tmp_path / "ctrl_c"
    proc = start(tmp_path, "ctrl_c", "trainer.total_steps=40", "trainer.save_every=1")
    wait_for(proc, lambda: metrics_lines(out) >= 1, "a logged step")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=TIMEOUT_S) == 130
    (line,) = error_lines(proc)
    assert line.startswith("error: interrupted by SIGINT at step ") and "trainer.resume=" in line, line
    step = int(re.search(r"at step (\d+);", line).group(1))
    assert list_checkpoints(out)[-1].name == f"step_{step:06d}"


def test_a_second_signal_stops_at_once(tmp_path):
    out = tmp_path / "twice"
    marker = tmp_path / "reward_started"
    proc = start(tmp_path, "twice", "plugins=[slow_reward]", "reward.rewards=[{name: tests.slow, reward_options: {seconds: 300}}]",
                 env={"PYTHONPATH": os.pathsep.join(p for p in [str(PLUGINS), os.environ.get("PYTHONPATH")] if p),
                      "SLOW_REWARD_MARKER": str(marker)})
    wait_for(proc, marker.exists, "the first step's reward")   # step 1 now waits 300 s on its reward
    proc.send_signal(signal.SIGTERM)
    wait_for(proc, lambda: "received SIGTERM" in proc.stderr_path.read_text(), "the first signal's notice")
    proc.send_signal(signal.SIGTERM)
    # Ended by the signal itself (not exit 143 after finishing the step), long before the reward is done.
    assert proc.wait(timeout=120) == -signal.SIGTERM
    assert list_checkpoints(out) == [] and metrics_lines(out) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_says_no_checkpoint_was_saved(sig):
    script = ("import os, signal, time\n"
              "from omni_rl.trainer.interrupt import StopOnSignal\n"
              "with StopOnSignal():\n"
              f"    os.kill(os.getpid(), {int(sig)})\n"
              f"    os.kill(os.getpid(), {int(sig)})\n"
              "    time.sleep(60)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == -sig
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [f"error: received {sig.name} again: stopped at once; no checkpoint was saved for the step in "
                     f"progress (resume from the last saved one, if any)"], done.stderr

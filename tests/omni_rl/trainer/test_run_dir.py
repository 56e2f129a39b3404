"""The output folder a run takes: checked, held by one run at a time, never mixed with another.

Most checks need no model: `open_run_dir` runs before any loads. Two run the tiny Qwen3 (a few
seconds a step) where what matters is the trainer's own outputs.
"""
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import save_file

from omni_rl.compose import load_config
from omni_rl.config import to_yaml
from omni_rl.errors import ConfigError
from omni_rl.trainer import PPOTrainer
from omni_rl.trainer.checkpoint import (
    FORMAT_VERSION,
    STATE_FILE,
    TENSORS_FILE,
    _rng_to_json,
    rng_state,
    write_manifest,
)
from omni_rl.trainer.run_dir import LOCK_FILE, RunDirError, check_output_dir, config_changes, hold, open_run_dir
from tests.tiny_runs import TINY_QWEN3

ROOT = Path(__file__).resolve().parents[3]
FAST = TINY_QWEN3


def cfg_for(out, *overrides):
    return load_config([*FAST, f"trainer.output_dir={out}", *overrides])


def steps(out):
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def fake_run(out, *checkpoint_steps):
    """An output folder as a finished run leaves it, without training one."""
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 7)))
    for step in checkpoint_steps:
        folder = out / "checkpoints" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        # A valid, empty trainer state (no tensors), so that the checkpoint verifies and decodes.
        state = {"format": FORMAT_VERSION, "step": step, "rng": _rng_to_json(rng_state()), "trainable_tensors": {},
                 "optimizer": {"state": {}, "param_groups": []}}
        (folder / STATE_FILE).write_text(json.dumps(state))
        save_file({}, str(folder / TENSORS_FILE))
        (folder / "config.yaml").write_text(to_yaml(cfg_for(out)))
        write_manifest(folder)  # written last, as a real save does
    return out


# --- one run per folder -----------------------------------------------------------------
def test_a_second_run_refuses_a_held_folder_naming_the_holder_and_the_lock_dies_with_it(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from omni_rl.trainer.run_dir import hold; "
                               "held = hold(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError) as err:
            open_run_dir(cfg_for(out))
        assert str(out) in str(err.value) and f"pid {holder.pid}" in str(err.value)
        assert "\n" not in str(err.value)
    finally:
        holder.send_signal(signal.SIGKILL)  # kill -9: no chance to unlock; the OS drops the lock
        holder.wait(timeout=60)
    open_run_dir(cfg_for(out)).release()
    assert (out / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} ")


def test_two_trainers_in_one_process_do_not_share_a_folder(tmp_path):
    held = hold(check_output_dir(str(tmp_path / "run")))
    try:
        with pytest.raises(RunDirError, match=f"in use by another run \\(pid {os.getpid()} "):
            PPOTrainer(cfg_for(tmp_path / "run"))  # refused before the model loads
    finally:
        held.release()


# --- a folder holding another run ---------------------------------------------------------
def test_a_fresh_run_refuses_a_folder_holding_another_run_and_touches_nothing(tmp_path):
    out = fake_run(tmp_path / "used", 4, 6)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(RunDirError) as err:
        open_run_dir(cfg_for(out, "trainer.total_steps=2"))
    text = str(err.value)
    assert "holds another run" in text and "checkpoints up to step 6" in text
    assert f"trainer.resume={out}" in text and "trainer.overwrite=true" in text
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.name != LOCK_FILE) == before


def test_resuming_a_run_in_its_own_folder_is_allowed_and_elsewhere_needs_overwrite(tmp_path):
    out = fake_run(tmp_path / "used", 4)
    open_run_dir(cfg_for(out, f"trainer.resume={out}")).release()
    open_run_dir(cfg_for(out, f"trainer.resume={out / 'checkpoints' / 'step_000004'}")).release()
    other = fake_run(tmp_path / "other", 2)
    with pytest.raises(RunDirError, match="is not in it"):
        open_run_dir(cfg_for(other, f"trainer.resume={out}"))
    with pytest.raises(RunDirError, match="would move aside"):
        open_run_dir(cfg_for(out, f"trainer.resume={out}", "trainer.overwrite=true"))
    assert (out / "checkpoints" / "step_000004" / STATE_FILE).is_file()


def test_a_folder_a_run_left_before_its_first_step_is_not_another_run(tmp_path):
    out = tmp_path / "failed_early"
    out.mkdir()
    (out / "config.yaml").write_text("x: 1\n")
    (out / "metrics.jsonl").write_text("")
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / ".step_000001.abcdefgh.tmp").mkdir()  # removed first: not a checkpoint
    open_run_dir(cfg_for(out)).release()
    assert list((out / "checkpoints").iterdir()) == []


def test_a_fresh_run_into_a_used_folder_refuses_and_overwrite_moves_the_old_run_aside(tmp_path):
    out = tmp_path / "run"
    PPOTrainer(cfg_for(out, "trainer.total_steps=2", "trainer.save_every=1")).fit()
    with pytest.raises(RunDirError, match="holds another run"):
        PPOTrainer(cfg_for(out, "trainer.total_steps=1"))
    assert steps(out) == [1, 2]

    PPOTrainer(cfg_for(out, "trainer.total_steps=1", "trainer.overwrite=true")).fit()
    assert steps(out) == [1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert steps(aside) == [1, 2]
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    assert (aside / "model" / "model.safetensors").is_file() and not (aside / LOCK_FILE).exists()


# --- resuming with another config -----------------------------------------------------------
def test_config_changes_name_each_changed_key_but_not_where_or_how_far(tmp_path):
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(cfg_for(tmp_path / "a")))
    now = to_yaml(cfg_for(tmp_path / "b", "trainer.total_steps=99", "optim.lr=0.01", f"trainer.resume={tmp_path}",
                          "rollout.sampling_options.stop_token_ids=[7]"))
    # An options block holds only what the recipe sets: the key is absent from the saved one.
    # (keys in sorted order: the option path now sorts after optim.lr)
    assert config_changes(saved, now) == ["optim.lr: 0.003 -> 0.01", "rollout.sampling_options.stop_token_ids: (absent) -> [7]"]
    assert config_changes(tmp_path / "missing.yaml", now) == []


def test_resuming_an_older_step_with_a_changed_config_says_so(tmp_path, caplog):
    out = fake_run(tmp_path / "run", 2, 4, 6)
    with caplog.at_level(logging.WARNING, logger="omni_rl.trainer.run_dir"):
        open_run_dir(cfg_for(out, f"trainer.resume={out / 'checkpoints' / 'step_000002'}", "optim.lr=0.01")).release()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "step_000002 with a changed config: optim.lr: 0.003 -> 0.01" in lines[0]
    assert "from step 2" in lines[1] and "checkpoints up to step 6" in lines[1]


# --- folders that cannot be output folders --------------------------------------------------
def test_empty_output_dir_is_refused_at_load():
    with pytest.raises(ConfigError, match="trainer.output_dir='': expected a folder path"):
        load_config([*FAST, "trainer.output_dir="])


def test_a_file_or_a_folder_under_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(RunDirError, match="is a file; expected a folder"):
        check_output_dir(str(tmp_path / "f"))
    with pytest.raises(RunDirError, match=f"{tmp_path / 'f'} is a file, so no folder can be made under it"):
        check_output_dir(str(tmp_path / "f" / "a" / "b"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_refused(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o555)
    with pytest.raises(RunDirError, match="not writable"):
        check_output_dir(str(tmp_path / "ro"))
    with pytest.raises(RunDirError, match="cannot create the folder"):
        check_output_dir(str(tmp_path / "ro" / "run"))


def test_a_read_only_folder_is_refused_even_for_root(tmp_path, monkeypatch):
    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # what a read-only mount answers
    with pytest.raises(RunDirError, match="not writable"):
        check_output_dir(str(tmp_path / "ro"))


def test_the_command_line_says_a_bad_output_dir_in_one_line(tmp_path):
    (tmp_path / "f").write_text("")
    result = subprocess.run([sys.executable, "main_omni.py", *FAST, f"trainer.output_dir={tmp_path / 'f'}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: trainer.output_dir='{tmp_path / 'f'}' is a file; expected a folder "
        f"(choose another trainer.output_dir or move the file)"
    ]

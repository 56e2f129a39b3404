"""Leftovers of killed runs: the temporaries of atomic writes and step folders without state.

The folders are laid out by hand as a kill -9 at each point of a save leaves them (names from
`tempfile`: 8 characters of [a-z0-9_]); no model is needed.
"""
import fcntl
import os
import tempfile
import time

from omni_rl.trainer.checkpoint import STATE_FILE, list_checkpoints
from omni_rl.trainer.leftovers import remove_leftovers, remove_stale_tiny_builds
from omni_rl.utils.atomic import leftover_of


def test_leftover_names_are_those_the_atomic_writers_use(tmp_path):
    made = [tempfile.mkdtemp(prefix=".step_000004.", suffix=".tmp", dir=tmp_path),
            tempfile.mkstemp(prefix=".config.yaml.", suffix=".tmp", dir=tmp_path)[1]]
    assert [leftover_of(os.path.basename(p)) for p in made] == [("step_000004", "tmp"), ("config.yaml", "tmp")]
    assert leftover_of(".lora.abcd_123.old") == ("lora", "old")
    for name in ["step_000004", ".step_000004.tmp", ".lora.abc.tmp", "notes.tmp", ".lora.ABCDEFGH.tmp"]:
        assert leftover_of(name) is None, name


def _dir(path, *files):
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_text("x")
    return path


def test_killed_saves_are_cleaned_and_only_they(tmp_path):
    out = tmp_path / "run"
    ckpt = out / "checkpoints"
    _dir(ckpt / "step_000004", STATE_FILE, "config.yaml")                 # a whole checkpoint
    _dir(ckpt / "step_000003", "config.yaml")                              # killed pre-atomic save
    _dir(ckpt / ".step_000006.k2x9_q1a.tmp", STATE_FILE)                   # killed atomic save
    _dir(ckpt / ".step_000002.zz00aa11.tmp")
    _dir(out / ".lora.abcdefgh.tmp", "adapter_model.safetensors")          # killed export
    _dir(out / ".model.abcdefgh.tmp")
    (out / ".config.yaml.a1b2c3d4.tmp").write_text("half")
    _dir(out / "samples", "val_step_000000.png", ".val_step_000002.png.q1w2e3r4.tmp")
    # Not the trainer's, or not its temporaries: left alone.
    _dir(ckpt / "step_000005.bak", "config.yaml")
    _dir(ckpt / "mine")
    (out / "notes.txt").write_text("keep")
    (out / ".notes.txt.abcdefgh.tmp").write_text("someone else's temporary")
    (ckpt / "step_000007").write_text("a file, not a checkpoint folder")

    done = remove_leftovers(out)

    assert len(done) == 7, done
    assert sorted(p.name for p in ckpt.iterdir()) == ["mine", "step_000004", "step_000005.bak", "step_000007"]
    assert sorted(p.name for p in out.iterdir()) == [".notes.txt.abcdefgh.tmp", "checkpoints", "notes.txt", "samples"]
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["val_step_000000.png"]
    assert [p.name for p in list_checkpoints(out)] == ["step_000004"]
    assert remove_leftovers(out) == []  # nothing left to do


def test_the_only_copy_left_between_two_renames_is_restored(tmp_path):
    out = tmp_path / "run"
    _dir(out / ".lora.abcdefgh.old", "adapter_model.safetensors")    # died after moving lora/ aside
    _dir(out / "checkpoints" / ".step_000002.abcdefgh.old", STATE_FILE)
    _dir(out / "model", "model.safetensors")                          # died after the second rename
    _dir(out / ".model.abcdefgh.old", "model.safetensors")

    remove_leftovers(out)

    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "lora", "model"]
    assert (out / "lora" / "adapter_model.safetensors").is_file()
    assert [p.name for p in list_checkpoints(out)] == ["step_000002"]


def _staging(folder, name, age_s):
    path = _dir(folder / name, "config.json")
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


def test_stale_tiny_model_builds_are_removed_only_when_no_build_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_RL_CACHE", str(tmp_path))
    tiny = tmp_path / "tiny"
    stale = _staging(tiny, ".sd3-abcd1234", age_s=7200)
    recent = _staging(tiny, ".sd3-wxyz9876", age_s=0)
    other = _staging(tiny, ".sd3_omni-abcd1234", age_s=7200)   # another model's build
    _dir(tiny / "sd3-v2", ".complete")
    (tiny / ".sd3-v2.lock").write_text("")

    with open(tiny / ".sd3-v2.lock") as held:  # a build in progress
        fcntl.flock(held, fcntl.LOCK_EX)
        assert remove_stale_tiny_builds("tiny:sd3") == []
    assert stale.exists()

    assert remove_stale_tiny_builds("tiny:sd3") == [stale]
    assert not stale.exists() and recent.exists() and other.exists() and (tiny / "sd3-v2").is_dir()
    assert remove_stale_tiny_builds(str(tiny / "sd3-v2")) == []  # not a tiny: path

"""What killed runs leave behind, cleaned up when the next run takes their folder.

`remove_leftovers` (run once the folder is held) removes only the trainer's own temporaries and
incomplete step folders, and renames a `.NAME.*.old` back to NAME. `remove_stale_tiny_builds`
removes a killed tiny-model build's staging folders, only with every build lock free.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

from omni_rl.trainer.checkpoint import MANIFEST_FILE, list_checkpoints
from omni_rl.utils.atomic import leftover_of

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_\d+$")
# What the trainer writes at the top of its output folder (exports: lora/ or model/).
_TOP_LEVEL = {"lora", "model", "config.yaml", "metrics.jsonl", "reward_curve.png"}
# The random part `tempfile.mkdtemp` adds to a tiny-model build's staging folder name.
_RANDOM = r"[a-z0-9_]{8}"


def remove_leftovers(output_dir: Path) -> list[str]:
    """Remove (or, for a complete `.old` copy, restore) the leftovers of killed runs in
    `output_dir`; returns what was done, one entry per leftover, paths relative to it."""
    output_dir = Path(output_dir)
    done: list[str] = []
    done += _tidy_temporaries(output_dir, lambda target: target in _TOP_LEVEL, output_dir)
    done += _tidy_temporaries(output_dir / "samples", lambda target: True, output_dir)
    checkpoints = output_dir / "checkpoints"
    done += _tidy_temporaries(checkpoints, lambda target: _STEP_DIR.match(target) is not None, output_dir)
    if checkpoints.is_dir():
        complete = {p.name for p in list_checkpoints(output_dir)}
        for entry in sorted(checkpoints.iterdir()):
            if not _STEP_DIR.match(entry.name) or not entry.is_dir() or entry.is_symlink():
                continue
            if entry.name not in complete:
                shutil.rmtree(entry)
                done.append(f"removed {entry.relative_to(output_dir)}/ (incomplete: no training state)")
            elif missing := _missing_files(entry):
                shutil.rmtree(entry)
                done.append(f"removed {entry.relative_to(output_dir)}/ (partly deleted: {missing} of the files its "
                            f"{MANIFEST_FILE} lists are gone, as a kill while pruning it leaves it)")
    if done:
        log.info("cleaned up after a killed run in %s: %s", output_dir, "; ".join(done))
    return done


def _missing_files(folder: Path) -> int:
    """How many of the files `folder`'s manifest lists are gone (0 without a readable manifest:
    a damaged checkpoint is left for the resume's verification to name)."""
    try:
        listed = json.loads((folder / MANIFEST_FILE).read_text())["files"]
        return sum(not (folder / rel).is_file() for rel in listed)
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _tidy_temporaries(folder: Path, ours, output_dir: Path) -> list[str]:
    if not folder.is_dir():
        return []
    done = []
    for entry in sorted(folder.iterdir()):
        kind = leftover_of(entry.name)
        if kind is None or not ours(kind[0]) or entry.is_symlink():
            continue
        target, what = folder / kind[0], kind[1]
        rel = entry.relative_to(output_dir)
        if what == "old" and entry.is_dir() and not target.exists():
            os.replace(entry, target)
            done.append(f"restored {target.relative_to(output_dir)}/ from {rel} (a save died between its renames)")
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        done.append(f"removed {rel}")
    return done


def remove_stale_tiny_builds(model_path: str, min_age_s: float = 3600.0) -> list[Path]:
    """Remove staging folders of killed builds of the tiny model `model_path` (`tiny:NAME`) from
    the model cache; returns them. Nothing happens for other model paths, while any build lock
    of the model is held, or for a folder changed within `min_age_s`."""
    from omni_rl.models.loading import TINY_PREFIX, cache_root

    if not model_path.startswith(TINY_PREFIX):
        return []
    name = model_path[len(TINY_PREFIX):]
    folder = cache_root() / "tiny"
    if not folder.is_dir():
        return []
    # `build_tiny_model` stages into mkdtemp(prefix=".NAME-") while it holds ".NAME-VERSION.lock".
    staging = re.compile(rf"^\.{re.escape(name)}-{_RANDOM}$")
    removed: list[Path] = []
    with contextlib.ExitStack() as locks:
        for lock_path in sorted(folder.glob(f".{name}-*.lock")):
            lock = locks.enter_context(open(lock_path, "a"))
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []  # a build is running: its staging folder is not stale
            locks.callback(fcntl.flock, lock, fcntl.LOCK_UN)
        now = time.time()
        for entry in sorted(folder.iterdir()):
            if (staging.match(entry.name) and entry.is_dir() and not entry.is_symlink()
                    and now - entry.stat().st_mtime > min_age_s):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    if removed:
        log.info("removed %d staging folder(s) of killed tiny:%s builds from %s", len(removed), name, folder)
    return removed

"""The run's output folder: checked, held and taken over before any model loads.

`open_run_dir(cfg)` creates `trainer.output_dir`, holds it with a `flock` on
`OUTPUT/.omni_rl.lock`, removes killed runs' leftovers, and refuses a folder holding another
run unless this run resumes it or `trainer.overwrite` moves the old outputs aside (never
deleting them). Left out: filesystems without a working `flock` (some NFS setups).
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import IO, Any, Optional

import yaml

from omni_rl.errors import OmniConfigError, OmniRunError
from omni_rl.config.schema import OmniConfig
from omni_rl.trainer.checkpoint import find_checkpoint, latest_step
from omni_rl.trainer.leftovers import remove_leftovers

log = logging.getLogger(__name__)

LOCK_FILE = ".omni_rl.lock"
# Keys a resume may change without it being news: they say where and how far, not how.
RESUME_KEYS_NOT_COMPARED = ("trainer.resume", "trainer.total_steps", "trainer.output_dir", "trainer.overwrite")
_STEP_DIR = re.compile(r"^step_(\d+)$")


class RunDirError(OmniConfigError, RuntimeError):
    """`trainer.output_dir` cannot be used by this run; the message says why and what to do."""


class OutputWriteError(OmniRunError):
    """Writing the run's outputs failed (a full disk, say); the message names what and where
    the last good checkpoint is."""


DISK_FULL = "no space left on device"
# How libraries that do their own I/O say ENOSPC / EDQUOT (safetensors: "... (os error 28)").
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122")


def write_failure(err: BaseException) -> Optional[str]:
    """Why `err` is a failed write, in words (DISK_FULL for a full disk or quota), or None when
    it is not one. An OSError is one; so is any error caused by, or reporting, a full disk:
    torch chains the OSError of its file object, safetensors raises its own SafetensorError."""
    seen, cause = set(), err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return DISK_FULL
        if any(text in str(cause) for text in _DISK_FULL_TEXT):
            return DISK_FULL
        cause = cause.__cause__ or cause.__context__
    return str(err) if isinstance(err, OSError) else None


class RunDir:
    """This process's hold on its output folder; `release()` lets another run take it."""

    def __init__(self, path: Path, lock: IO[str]):
        self.path = path
        self._lock: Optional[IO[str]] = lock

    def release(self) -> None:
        if self._lock is not None:
            # Unlock, do not delete: a run waiting on the old file would lock a deleted inode.
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


def open_run_dir(cfg: OmniConfig) -> RunDir:
    """Check, hold, clean and (if allowed) take over `cfg.trainer.output_dir`; see the module."""
    t = cfg.trainer
    path = check_output_dir(t.output_dir)
    run_dir = hold(path)
    try:
        remove_leftovers(path)
        resume_from = find_checkpoint(t.resume).resolve() if t.resume else None
        continues_here = resume_from is not None and resume_from.is_relative_to(path.resolve())
        if t.overwrite and continues_here:
            raise RunDirError(
                f"trainer.overwrite=true would move aside {resume_from}, the checkpoint trainer.resume={t.resume!r} "
                f"continues from; drop trainer.overwrite to continue the run in {str(path)!r}"
            )
        previous = previous_run(path)
        if previous and not continues_here:
            if not t.overwrite:
                raise RunDirError(_refusal(path, previous, t.resume))
            moved = move_aside(path)
            log.warning(
                "trainer.overwrite=true: moved the previous run in %s (%s) to %s; delete that folder when you no "
                "longer need it", path, previous, moved,
            )
        if resume_from is not None:
            note_resume(resume_from, path if continues_here else None, cfg)
    except BaseException:
        run_dir.release()
        raise
    return run_dir


def check_output_dir(output_dir: str) -> Path:
    """`output_dir` as a folder this process can write, created if needed; else RunDirError."""
    path = Path(output_dir)
    key = f"trainer.output_dir={output_dir!r}"
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{key} is a file; expected a folder (choose another trainer.output_dir or move the file)")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise RunDirError(f"{key}: {parent} is a file, so no folder can be made under it; choose another "
                                  f"trainer.output_dir")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(f"{key}: cannot create the folder ({_reason(err)}); choose a folder you can write to") from err
    if not os.access(path, os.W_OK | os.X_OK):
        raise RunDirError(f"{key}: the folder is not writable (read-only, or owned by another user); choose a folder "
                          f"you can write to")
    return path


def hold(path: Path) -> RunDir:
    """An exclusive lock on `path`'s lock file with this process named in it; RunDirError,
    naming the holder, when another run (or another trainer in this process) has it."""
    key = f"trainer.output_dir={str(path)!r}"
    try:
        lock = open(path / LOCK_FILE, "a+", encoding="utf-8")
    except OSError as err:
        raise RunDirError(f"{key}: cannot write there ({_reason(err)}); choose a folder you can write to") from err
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "a process that has not yet written its pid"
        lock.close()
        raise RunDirError(
            f"{key} is in use by another run ({holder}); wait for it to end, stop it, or choose another "
            f"trainer.output_dir"
        ) from None
    try:
        lock.truncate(0)
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
    except OSError as err:
        lock.close()
        raise RunDirError(f"{key}: cannot write there ({_reason(err)}); free some space or choose another "
                          f"trainer.output_dir") from err
    return RunDir(path, lock)


def previous_run(path: Path) -> Optional[str]:
    """What of an earlier run `path` holds, in words; None when nothing (a lock file and a
    config.yaml alone are not a run: they are what a run that failed before step 1 leaves)."""
    found = []
    metrics = path / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append("metrics.jsonl")
    checkpoints = path / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        step = latest_step(path)
        found.append(f"checkpoints up to step {step}" if step is not None else "checkpoints/")
    found += [f"{name}/" for name in ("lora", "model") if (path / name).exists()]
    return ", ".join(found) or None


def move_aside(path: Path) -> Path:
    """Move everything in `path` but the lock file into a new sibling folder; returns it."""
    path = path.resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = path.with_name(f"{path.name}.replaced-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = path.with_name(f"{path.name}.replaced-{stamp}-{n}")
    try:
        dest.mkdir()
        for entry in sorted(path.iterdir()):
            if entry.name != LOCK_FILE:
                os.replace(entry, dest / entry.name)
    except OSError as err:
        raise RunDirError(
            f"trainer.overwrite=true: cannot move the previous run in {str(path)!r} to {str(dest)!r} "
            f"({_reason(err)}); move or remove it yourself, or choose another trainer.output_dir"
        ) from err
    return dest


def note_resume(checkpoint: Path, output_dir: Optional[Path], cfg: OmniConfig) -> None:
    """Log one line listing the config keys that differ from the checkpoint's config.yaml, and
    one saying so when `output_dir` (the folder the run continues in) has later checkpoints."""
    from omni_rl.config.loader import to_yaml

    changes = config_changes(checkpoint / "config.yaml", to_yaml(cfg))
    if changes:
        log.warning("resuming from %s with a changed config: %s", checkpoint, "; ".join(changes))
    match = _STEP_DIR.match(checkpoint.name)
    latest = latest_step(output_dir) if output_dir is not None else None
    if match and latest is not None and latest > int(match.group(1)):
        step = int(match.group(1))
        log.warning(
            "resuming from step %d although %s has checkpoints up to step %d: steps after %d are trained again and "
            "metrics.jsonl keeps only steps up to %d", step, output_dir, latest, step, step,
        )


def config_changes(saved_config: Path, current_yaml: str) -> list[str]:
    """`key: old -> new` for each leaf that differs between the two configs (lists compare
    whole), leaving out RESUME_KEYS_NOT_COMPARED; [] when the saved config is missing."""
    from omni_rl.config.loader import upgrade_saved_config

    if not saved_config.is_file():
        return []
    try:
        # A config written before the sampling knobs moved is compared in today's layout.
        old = _flatten(upgrade_saved_config(yaml.safe_load(saved_config.read_text(encoding="utf-8")) or {}))
    except (OSError, yaml.YAMLError) as err:
        log.warning("cannot read %s to compare configs: %s", saved_config, err)
        return []
    new = _flatten(yaml.safe_load(current_yaml) or {})
    changes = []
    for key in sorted(old.keys() | new.keys()):
        if key not in RESUME_KEYS_NOT_COMPARED and (key in old, old.get(key)) != (key in new, new.get(key)):
            changes.append(f"{key}: {_shown(old, key)} -> {_shown(new, key)}")
    return changes


def _shown(flat: dict[str, Any], key: str) -> str:
    return repr(flat[key]) if key in flat else "(absent)"


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        flat: dict[str, Any] = {}
        for key, value in tree.items():
            flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: tree}


def _refusal(path: Path, previous: str, resume: Optional[str]) -> str:
    where = f"trainer.output_dir={str(path)!r} holds another run ({previous})"
    if resume is not None:
        return (f"{where}, and trainer.resume={resume!r} is not in it; resume into an empty trainer.output_dir, or "
                f"pass trainer.overwrite=true to move that run to a sibling folder first")
    return (f"{where}; continue it with trainer.resume={str(path)}, replace it with trainer.overwrite=true (its "
            f"outputs are moved to a sibling folder {path.name}.replaced-DATE-TIME), or choose another "
            f"trainer.output_dir")


def _reason(err: OSError) -> str:
    return DISK_FULL if err.errno in (errno.ENOSPC, errno.EDQUOT) else err.strerror or str(err)

"""`rollout.python` checked before any model loads: the interpreter the rollout server runs in.

`check_python(path)` refuses, with one `ConfigError` line (exit 2), a path that does not exist,
is a folder, is not executable, or does not run as a Python (`PATH -c ...` must exit 0 within
`RUN_TIMEOUT_S` and print a Python version): found at load, not minutes later when the server
fails to start after the trainer's model has loaded. A bare name (`python3.11`) is looked up on
PATH, as `subprocess` does.

Not here: whether that Python has omni_rl's dependencies (the server says so when it starts).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from omni_rl.config.validate import ConfigError

# Starting an interpreter takes well under a second; a loaded machine or a cold disk more.
RUN_TIMEOUT_S = 60.0
_PROBE = "import sys; print('python %d.%d' % sys.version_info[:2])"


def check_python(path: Optional[str], key: str = "rollout.python") -> None:
    """ConfigError naming `key` unless `path` is null or a Python interpreter that runs."""
    if path is None:
        return
    found = shutil.which(path) if os.sep not in path else path
    file = Path(found or path).expanduser()
    expected = "a path to a Python interpreter (e.g. /opt/vllm-omni/bin/python), or null for this one"
    if not file.exists():
        raise ConfigError(f"{key}={path!r}: no such file{'' if os.sep in path else ' on PATH'}; expected {expected}")
    if file.is_dir():
        raise ConfigError(f"{key}={path!r} is a folder, not a file; expected {expected} (its bin/python?)")
    if not os.access(file, os.X_OK):
        raise ConfigError(f"{key}={path!r} is not executable (chmod +x it?); expected {expected}")
    try:
        done = subprocess.run([str(file), "-c", _PROBE], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigError(f"{key}={path!r} cannot run ({type(err).__name__}: {err}); expected {expected}") from None
    if done.returncode != 0 or not done.stdout.startswith("python "):
        said = " ".join((done.stderr or done.stdout).split())[:200]
        raise ConfigError(f"{key}={path!r} did not run as a Python (exit {done.returncode}{': ' + said if said else ''}); "
                          f"expected {expected}")

"""`rollout.python` checked before any model loads: the interpreter the rollout server runs in.

`check_python(path)` refuses, with one `ConfigError` line (exit 2), a path that does not exist,
is a folder, is not executable, or that the OS cannot start (`PATH -c pass` fails to exec: a
script whose `#!` interpreter is missing, a binary for another machine): found at load, not
minutes later when the server fails to start after the trainer's model has loaded. A bare name
(`python3.11`) is looked up on PATH, as `subprocess` does.

Not here: a program that starts but is no Python, or a Python without omni_rl's dependencies:
the server fails to start and the run says so with its exit code (exit 1).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

from omni_rl.errors import ConfigError

# Starting an interpreter takes well under a second; a loaded machine or a cold disk more.
RUN_TIMEOUT_S = 60.0


# Prints the modules named on its command line that this Python cannot find, after a marker (the
# marker tells a Python's answer from whatever another program prints).
_FIND_MODULES = ("import importlib.util, sys\n"
                 "print('missing:' + ','.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")


def check_python(path: Optional[str], key: str = "rollout.backend_options.python",
                 packages: Sequence[tuple[str, str]] = (), backend: str = "") -> None:
    """ConfigError naming `key` unless `path` is null or a Python interpreter that runs and finds
    every module of `packages` ((module, pip name) pairs that `rollout.backend=backend` needs)."""
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
        # Only whether the OS can start it: a program that starts but fails (or is no Python)
        # is the server's to report, with its exit code, when it starts.
        done = subprocess.run([str(file), "-c", _FIND_MODULES, *(m for m, _ in packages)], capture_output=True,
                              text=True, errors="replace", timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return  # it started; a slow one is left to rollout.server_startup_timeout_s
    except OSError as err:
        raise ConfigError(f"{key}={path!r} cannot run ({err.strerror or err}: a script whose #! interpreter is "
                          f"missing, or a program for another machine?); expected {expected}") from None
    answer = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    if not answer or not answer[0].startswith("missing:"):
        return  # no Python's answer: the server reports what it is when it starts
    missing = set(filter(None, answer[0][len("missing:"):].split(",")))
    lacking = [(m, pip) for m, pip in packages if m in missing]
    if lacking:
        names = " and ".join(repr(m) for m, _ in lacking)
        raise ConfigError(
            f"{key}={path!r} cannot import {names}, which rollout.backend={backend!r} runs on behind the rollout "
            f"server; install {'them' if len(lacking) > 1 else 'it'} into that Python (`{path} -m pip install "
            f"{' '.join(pip for _, pip in lacking)}`), or set {key} to a Python that has "
            f"{'them' if len(lacking) > 1 else 'it'} (the CUDA image's /opt/vllm-omni/bin/python)"
        )

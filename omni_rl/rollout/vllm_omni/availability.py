"""Whether this Python can run a GPU rollout backend, and the one error when it cannot."""
from __future__ import annotations

import importlib.util
import sys

# What each backend needs to import here, and the pip name it is installed by.
NEEDS = {"vllm_omni": ("vllm_omni", "vllm-omni"), "vllm": ("vllm", "vllm")}


class BackendUnavailableError(RuntimeError):
    """A rollout backend's package is not installed in this Python."""


def require(backend: str) -> None:
    """Raise `BackendUnavailableError` naming `rollout.backend`, the missing package and the fix."""
    module, package = NEEDS[backend]
    if importlib.util.find_spec(module) is not None:
        return
    raise BackendUnavailableError(
        f"rollout.backend={backend!r} needs the {package!r} package (CUDA only), which this Python "
        f"({sys.executable}) does not have. In the CUDA image it lives in an environment of its own: "
        f"set rollout.options.python=/opt/vllm-omni/bin/python to run the engine there, behind the rollout "
        f"server (docker/Dockerfile.cuda installs vllm and vllm-omni into it); or install it here on "
        f"a CUDA machine (pip install vllm==0.30.0 vllm-omni==0.30.0); or use rollout.backend=native"
    )

"""Resolves `model.path` to a local folder and turns missing weights into an actionable error.

- `tiny:NAME`: a tiny random-weight model, built by the registered builder into
  `$OMNI_RL_CACHE/tiny/NAME` (default `~/.cache/omni_rl`) once, atomically, then loaded from
  there like any other checkpoint. Processes asking at once (Ray workers) take turns on a file
  lock: one builds, the others load its result.
- a local folder: used as it is.
- anything else is a hub id: it is looked up in the local Hugging Face cache first; if it is not
  there and the hub cannot be reached, `MissingWeightsError` says what is missing and how to
  fetch it.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from omni_rl.models.registry import TINY_MODELS

TINY_PREFIX = "tiny:"
# Bump when a tiny builder changes, so stale caches are rebuilt rather than reused.
TINY_FORMAT_VERSION = "v2"
# Files a hub snapshot can leave out when only the model's configs and processors are needed.
WEIGHT_FILE_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.onnx", "*.msgpack", "*.h5")


class MissingWeightsError(FileNotFoundError):
    """The model's weights are neither local nor downloadable."""


def cache_root() -> Path:
    return Path(os.environ.get("OMNI_RL_CACHE", Path.home() / ".cache" / "omni_rl"))


def resolve_model_path(path: str, revision: str | None = None, weights: bool = True) -> str:
    """Return a local folder for `path` (building a tiny model or downloading as needed); with
    `weights=False` a hub download leaves out the weight files (for a weightless view)."""
    if path.startswith(TINY_PREFIX):
        return str(build_tiny_model(path[len(TINY_PREFIX):]))
    expanded = Path(path).expanduser()
    if expanded.exists():
        if not expanded.is_dir():
            raise MissingWeightsError(f"model.path={path!r} is a file; expected a model folder or a hub id")
        return str(expanded)
    if path.startswith((".", "/", "~")):
        raise MissingWeightsError(f"model.path={path!r}: no such folder")
    return _hub_snapshot(path, revision, weights)


def build_tiny_model(name: str) -> Path:
    from omni_rl.plugins import load_plugins

    load_plugins()  # the builders live in the adapter / reward plugins
    builder = TINY_MODELS.get(name)
    target = cache_root() / "tiny" / f"{name}-{TINY_FORMAT_VERSION}"
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Several processes (Ray workers) may ask at once: one builds, the others wait for it and
    # then load its result (replacing a folder another process is reading would break it).
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        # Build in a sibling temp folder and rename: a crash never leaves a half-written model
        # that a later run would load.
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            run_builder(name, builder, staging)
            (staging / ".complete").write_text("ok\n")
            if target.exists():  # an interrupted earlier build
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


# argv: the builder's module (imported, so the builder registers), the model name, the folder.
_BUILD_IN_SUBPROCESS = (
    "import importlib, sys; from pathlib import Path; from omni_rl.models.loading import run_builder; "
    "from omni_rl.models.registry import TINY_MODELS; importlib.import_module(sys.argv[1]); "
    "run_builder(sys.argv[2], TINY_MODELS.get(sys.argv[2]), Path(sys.argv[3]))"
)


def run_builder(name: str, builder, folder: Path) -> None:
    """Run a tiny-model builder into `folder`, in this process when it can write every file.

    transformers (>= 5) writes weight files only on rank 0 of an initialized torch.distributed
    group, so a Ray worker of another rank would build a model without weights: there the
    builder runs in a fresh Python process (`_BUILD_IN_SUBPROCESS`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        cmd = [sys.executable, "-c", _BUILD_IN_SUBPROCESS, builder.__module__, name, str(folder)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"building tiny:{name} in a subprocess failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        return
    # Builders seed torch for reproducible weights; fork the RNG so building a model on a
    # fresh cache does not change the random stream of the run that asked for it.
    with torch.random.fork_rng():
        builder(folder)


def _hub_snapshot(repo_id: str, revision: str | None, weights: bool = True) -> str:
    from huggingface_hub import snapshot_download

    # A weightless view (the Ray driver) needs configs, tokenizers and processors only.
    skip = None if weights else list(WEIGHT_FILE_PATTERNS)
    try:
        return snapshot_download(repo_id, revision=revision, local_files_only=True, ignore_patterns=skip)
    except Exception:
        pass
    try:
        return snapshot_download(repo_id, revision=revision, ignore_patterns=skip)
    except Exception as err:
        raise MissingWeightsError(
            f"model weights {repo_id!r} are not on this machine and could not be downloaded "
            f"({type(err).__name__}). Fetch them where the hub is reachable, e.g. "
            f"`hf download {repo_id} --local-dir /models/{repo_id.split('/')[-1]}` "
            f"(gated models need their licence accepted on the hub and `hf auth login`), "
            f"then set model.path=/models/{repo_id.split('/')[-1]} or copy them into the Hugging Face cache"
        ) from None

"""Resolves `model.path` to a local folder and turns missing weights into an actionable error.

- `tiny:NAME`: a tiny random-weight model, built by the registered builder into
  `$OMNI_RL_CACHE/tiny/NAME` (default `~/.cache/omni_rl`) once, atomically, then loaded from
  there like any other checkpoint.
- a local folder: used as it is.
- anything else is a hub id: it is looked up in the local Hugging Face cache first; if it is not
  there and the hub cannot be reached, `MissingWeightsError` says what is missing and how to
  fetch it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from omni_rl.models.registry import TINY_MODELS

TINY_PREFIX = "tiny:"
# Bump when a tiny builder changes, so stale caches are rebuilt rather than reused.
TINY_FORMAT_VERSION = "v2"


class MissingWeightsError(FileNotFoundError):
    """The model's weights are neither local nor downloadable."""


def cache_root() -> Path:
    return Path(os.environ.get("OMNI_RL_CACHE", Path.home() / ".cache" / "omni_rl"))


def resolve_model_path(path: str, revision: str | None = None) -> str:
    """Return a local folder for `path` (building a tiny model or downloading as needed)."""
    if path.startswith(TINY_PREFIX):
        return str(build_tiny_model(path[len(TINY_PREFIX):]))
    expanded = Path(path).expanduser()
    if expanded.exists():
        if not expanded.is_dir():
            raise MissingWeightsError(f"model.path={path!r} is a file; expected a model folder or a hub id")
        return str(expanded)
    if path.startswith((".", "/", "~")):
        raise MissingWeightsError(f"model.path={path!r}: no such folder")
    return _hub_snapshot(path, revision)


def build_tiny_model(name: str) -> Path:
    from omni_rl.plugins import load_plugins

    load_plugins()  # the builders live in the adapter / reward plugins
    builder = TINY_MODELS.get(name)
    target = cache_root() / "tiny" / f"{name}-{TINY_FORMAT_VERSION}"
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp folder and rename: a crash never leaves a half-written model
    # that a later run would load.
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        # Builders seed torch for reproducible weights; fork the RNG so building a model on a
        # fresh cache does not change the random stream of the run that asked for it.
        with torch.random.fork_rng():
            builder(staging)
        (staging / ".complete").write_text("ok\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _hub_snapshot(repo_id: str, revision: str | None) -> str:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, revision=revision, local_files_only=True)
    except Exception:
        pass
    try:
        return snapshot_download(repo_id, revision=revision)
    except Exception as err:
        raise MissingWeightsError(
            f"model weights {repo_id!r} are not on this machine and could not be downloaded "
            f"({type(err).__name__}). Fetch them where the hub is reachable, e.g. "
            f"`hf download {repo_id} --local-dir /models/{repo_id.split('/')[-1]}` "
            f"(gated models need their licence accepted on the hub and `hf auth login`), "
            f"then set model.path=/models/{repo_id.split('/')[-1]} or copy them into the Hugging Face cache"
        ) from None

"""Resolves `model.path` to a local folder and turns missing weights into an actionable error.

`tiny:NAME` builds a tiny model once into `$OMNI_RL_CACHE/tiny/NAME` (under a file lock) or gives
a packaged model's folder; a local folder must hold a model (and match its `SHA256SUMS`); anything
else is a hub id, fetched after a short probe, else a `MissingWeightsError` saying how to fetch it.
`check_model_source(model_cfg)` runs the checks without loading anything.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Optional

import torch

from omni_rl.errors import OmniConfigError, OmniRunError
from omni_rl.models.checksums import SUMS_FILE, ChecksumError, verify_checksums
from omni_rl.models.registry import PACKAGED_MODELS, TINY_MODELS

TINY_PREFIX = "tiny:"
# Bump when what every tiny builder shares changes (a helper module, the cache layout), so stale
# caches are rebuilt rather than reused; a change to a builder's own module changes its folder's
# name by itself (`builder_digest`).
TINY_FORMAT_VERSION = "v3"
# Files a hub snapshot can leave out when only the model's configs and processors are needed.
WEIGHT_FILE_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.onnx", "*.msgpack", "*.h5")
# How long to wait for a TCP connection to the hub before calling it unreachable.
HUB_PROBE_TIMEOUT_S = 3.0


class MissingWeightsError(OmniRunError, FileNotFoundError):
    """The model's weights are neither local nor downloadable (a hub id neither cached nor
    reachable from here: exit 1)."""


class ModelFolderError(OmniConfigError, MissingWeightsError):
    """`model.path` names a file, a missing folder, or a folder that holds no loadable model
    (bad input: the command line exits 2 for it, where other missing weights exit 1)."""

    exit_code = OmniConfigError.exit_code


def cache_root() -> Path:
    return Path(os.environ.get("OMNI_RL_CACHE", Path.home() / ".cache" / "omni_rl"))


def resolve_model_path(path: str, revision: str | None = None, weights: bool = True) -> str:
    """Return a local folder for `path` (building a tiny model or downloading as needed); with
    `weights=False` a hub download leaves out the weight files (for a weightless view)."""
    if path.startswith(TINY_PREFIX):
        packaged = packaged_model_folder(path[len(TINY_PREFIX):])
        return str(packaged if packaged is not None else build_tiny_model(path[len(TINY_PREFIX):]))
    folder = _local_folder(path)
    if folder is not None:
        check_model_folder(folder, path, weights)
        return str(folder)
    return _hub_snapshot(path, revision, weights)


def check_model_source(cfg, weights: bool = True) -> None:
    """Check `cfg.path` (a `ModelConfig`'s) before anything loads: a local folder must hold a
    model, a hub id must be in the Hugging Face cache or the hub reachable. Downloads and builds
    nothing; raises `ModelFolderError` or `MissingWeightsError`."""
    path = cfg.path
    if path.startswith(TINY_PREFIX):
        packaged_model_folder(path[len(TINY_PREFIX):])
        return
    folder = _local_folder(path)
    if folder is not None:
        check_model_folder(folder, path, weights)
        return
    cached = _cached_snapshot(path, cfg.revision, weights)
    if cached is not None:
        try:
            check_model_folder(cached, path, weights)
            return
        except ModelFolderError:
            pass  # incomplete in the cache: the download fetches the rest
    reason = hub_unreachable()
    if reason is not None:
        raise MissingWeightsError(_fetch_hint(path, reason))


def packaged_model_folder(name: str) -> Optional[Path]:
    """The checked folder of the packaged model `name`, None when `name` is not one (then it
    is a tiny builder's); `ModelFolderError` when a file fails its checksum."""
    from omni_rl.plugins import load_plugins

    load_plugins()  # packaged models are registered by the adapter plugins
    if name not in PACKAGED_MODELS.names():
        return None
    folder = PACKAGED_MODELS.get(name)
    _check_sums(folder, f"tiny:{name}", "restore the shipped files (`git checkout -- <file>`) or reinstall omni-rl")
    return folder


def _check_sums(folder: Path, path: str, fix: str) -> None:
    try:
        verify_checksums(folder, fix)
    except ChecksumError as err:
        raise ModelFolderError(f"model.path={path!r}: {err}") from None


def _local_folder(path: str) -> Optional[Path]:
    """The folder `path` names, None for a hub id; `ModelFolderError` for a file or for a path
    that is neither an existing folder nor a hub id."""
    expanded = Path(path).expanduser()
    if expanded.exists():
        if not expanded.is_dir():
            raise ModelFolderError(f"model.path={path!r} is a file; expected a model folder or a hub id (ORG/NAME)")
        return expanded
    if path.startswith((".", "/", "~")) or not _is_repo_id(path):
        raise ModelFolderError(
            f"model.path={path!r}: no such folder (and not a hub id, which looks like ORG/NAME); "
            f"check the path"
        )
    return None


def _is_repo_id(path: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(path)
    except HFValidationError:
        return False
    return True


# A diffusers pipeline's index: `model_index.json` ([library, class] per component), or a modular
# pipeline's `modular_model_index.json` ([library, class, loading spec] per component, the spec
# naming the component's `subfolder`), which is all a modular-only checkpoint (MiniMax-H3) has.
PIPELINE_INDEXES = ("model_index.json", "modular_model_index.json")


def pipeline_index(folder: Path) -> Optional[Path]:
    """The folder's pipeline index (`PIPELINE_INDEXES`, `model_index.json` first), None if none."""
    return next((folder / name for name in PIPELINE_INDEXES if (folder / name).is_file()), None)


def index_components(index: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """name -> (its class, its subfolder) of every component an index lists: `[library, class]`
    lives in the subfolder of its name; `[library, class, spec]` in `spec["subfolder"]` (its name
    when the spec names none). Metadata (`_class_name`, ...) and absent components ([null, null]) are
    left out."""
    out = {}
    for name, entry in index.items():
        if name.startswith("_") or not isinstance(entry, list) or len(entry) not in (2, 3) or not all(entry[:2]):
            continue
        spec = entry[2] if len(entry) == 3 and isinstance(entry[2], dict) else {}
        out[name] = (str(entry[1]), str(spec.get("subfolder") or name))
    return out


def check_model_folder(folder: Path, path: str, weights: bool = True) -> None:
    """Raise `ModelFolderError` unless `folder` looks like a model the adapters can load: a
    diffusers pipeline (`model_index.json`, or a modular pipeline's `modular_model_index.json`, each
    listed component in its subfolder) or a transformers model (`config.json`), every JSON readable
    and, with `weights`, every model config next to a weight file. `path` is what `model.path` said,
    for the message."""
    folder = Path(folder)
    index, config = pipeline_index(folder), folder / "config.json"
    if weights and (folder / SUMS_FILE).is_file():
        _check_sums(folder, path, "re-download or re-copy the model")
    if index is not None:
        for name, (cls, subfolder) in index_components(_read_json(index, path)).items():
            component = folder / subfolder
            if not component.is_dir():
                raise ModelFolderError(
                    f"model.path={path!r}: {index.name} lists the component {name!r} ({cls}) but "
                    f"{component} is missing; the download is incomplete: fetch the whole repository"
                )
            if (component / "config.json").is_file():
                _check_model_config(component, path, weights)
    elif config.is_file():
        _check_model_config(folder, path, weights)
    else:
        what = ("is an empty folder" if not any(folder.iterdir())
                else "has neither model_index.json nor config.json (nor a modular_model_index.json)")
        raise ModelFolderError(
            f"model.path={path!r}: {folder} {what}; expected a model folder: a diffusers pipeline "
            f"(model_index.json, or modular_model_index.json) or a transformers model (config.json), as "
            f"`hf download ORG/NAME --local-dir DIR` writes it"
        )


def _check_model_config(folder: Path, path: str, weights: bool) -> None:
    _read_json(folder / "config.json", path)
    if weights and not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILE_PATTERNS):
        raise ModelFolderError(
            f"model.path={path!r}: {folder} has a config.json but no weight file (*.safetensors, "
            f"*.bin, ...); the download is incomplete: fetch the whole repository"
        )


def _read_json(file: Path, path: str) -> dict[str, Any]:
    try:
        value = json.loads(file.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        problem = f"is not UTF-8 text (byte {err.start})"
    except json.JSONDecodeError as err:
        problem = f"is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})"
    else:
        if isinstance(value, dict):
            return value
        problem = f"holds a JSON {type(value).__name__}, not an object"
    raise ModelFolderError(f"model.path={path!r}: {file} {problem}; re-download the model or fix the file")


def tiny_model_folder(name: str) -> Path:
    """Where the tiny model `name` is (or will be) built in the cache; builds nothing."""
    from omni_rl.plugins import load_plugins

    load_plugins()  # the builders live in the adapter / reward plugins
    return cache_root() / "tiny" / f"{name}-{TINY_FORMAT_VERSION}-{builder_digest(TINY_MODELS.get(name))}"


def cached_snapshot(repo_id: str, revision: str | None) -> Optional[Path]:
    """The hub snapshot of `repo_id` in the Hugging Face cache (configs at least), None when
    there is none; downloads nothing."""
    return _cached_snapshot(repo_id, revision, weights=False)


def build_tiny_model(name: str) -> Path:
    from omni_rl.plugins import load_plugins

    load_plugins()  # the builders live in the adapter / reward plugins
    target = tiny_model_folder(name)
    builder = TINY_MODELS.get(name)
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


def builder_digest(builder) -> str:
    """12 hex digits of the sha256 of the source file of the builder's module: a cached tiny model
    built by an older version of that file is not reused."""
    module = sys.modules.get(builder.__module__)
    source = getattr(module, "__file__", None)
    if not source or not Path(source).is_file():
        return "nosource"
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()[:12]


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

    cached = _cached_snapshot(repo_id, revision, weights)
    if cached is not None:
        try:
            check_model_folder(cached, repo_id, weights)
            return str(cached)
        except ModelFolderError:
            pass  # incomplete in the cache: the download below fetches the rest
    reason = hub_unreachable()
    if reason is not None:
        raise MissingWeightsError(_fetch_hint(repo_id, reason))
    try:
        folder = snapshot_download(repo_id, revision=revision, ignore_patterns=_skipped(weights))
    except Exception as err:
        raise MissingWeightsError(_fetch_hint(repo_id, f"the download failed: {type(err).__name__}")) from None
    check_model_folder(Path(folder), repo_id, weights)
    return folder


def _skipped(weights: bool) -> Optional[list[str]]:
    # A weightless view (the Ray driver) needs configs, tokenizers and processors only.
    return None if weights else list(WEIGHT_FILE_PATTERNS)


def _cached_snapshot(repo_id: str, revision: str | None, weights: bool) -> Optional[Path]:
    """The snapshot of `repo_id` in the local Hugging Face cache, or None; no network."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True, ignore_patterns=_skipped(weights)))
    except Exception:
        return None


def hub_unreachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> Optional[str]:
    """Why the Hugging Face hub cannot be reached from here, or None when it can.

    HF_HUB_OFFLINE=1 says so without trying; otherwise one TCP connection to the endpoint
    (HF_ENDPOINT), or to the HTTPS proxy when one is set, gets `timeout` seconds in all, name
    lookup included: without it a firewalled machine waits out huggingface_hub's timeouts and
    retries before the same error."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    url = urllib.parse.urlsplit(constants.ENDPOINT)
    proxy = urllib.request.getproxies().get(url.scheme)
    target = urllib.parse.urlsplit(proxy) if proxy and not urllib.request.proxy_bypass(url.hostname or "") else url
    host, port = target.hostname, target.port or (443 if target.scheme == "https" else 80)
    outcome: dict[str, Any] = {}

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome["ok"] = True
        except Exception as err:  # OSError mostly; any failure means no hub
            outcome["error"] = err

    # A thread, because socket timeouts do not cover the name lookup.
    probe = threading.Thread(target=connect, name="hub-probe", daemon=True)
    probe.start()
    probe.join(timeout)
    if outcome.get("ok"):
        return None
    if "error" in outcome:
        return f"no connection to {host}:{port}: {outcome['error']}"
    return f"no answer from {host}:{port} within {timeout:g} s"


def _fetch_hint(repo_id: str, reason: str) -> str:
    from huggingface_hub import constants

    name = repo_id.split("/")[-1]
    return (
        f"model.path={repo_id!r}: not a local folder, not in the Hugging Face cache "
        f"({constants.HF_HUB_CACHE}), and not downloadable from {constants.ENDPOINT} ({reason}). "
        f"Fetch the weights where the hub is reachable, e.g. `hf download {repo_id} --local-dir "
        f"/models/{name}` (gated models need their licence accepted on the hub and `hf auth login`), "
        f"then set model.path=/models/{name} or copy them into the Hugging Face cache"
    )

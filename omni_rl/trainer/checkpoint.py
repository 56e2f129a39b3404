"""Full checkpoints: written atomically, verified before they load, never unpickled.

A checkpoint folder holds the trainer state, the backend's tensors, the export, `config.yaml` and
`manifest.json` (size and sha256 of every file, written last). Loading checks the manifest and
reads only JSON, YAML, safetensors and allow-listed DCP metadata; `check_compatible` runs first.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import pickle
import random
import re
import secrets
import shutil
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Optional

import numpy as np
import torch
import yaml

from omni_rl.errors import OmniConfigError
from omni_rl.utils.atomic import (
    atomic_directory,
    atomic_save_safetensors,
    atomic_write_json,
    atomic_write_text,
)

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
FORMAT_VERSION = 2
STATE_FILE = "trainer_state.json"
TENSORS_FILE = "trainer_state.safetensors"
PIPELINE_FILE = "pipeline.safetensors"
MANIFEST_FILE = "manifest.json"
CONFIG_FILE = "config.yaml"
FAMILY_PREFIX = "family/"
EMA_PREFIX = "ema/"
# The pickle earlier versions wrote; recognised only to refuse it.
LEGACY_STATE_FILE = "trainer_state.pt"
# Sharded runs (trainer.backend=ray) keep the optimizer and trainable tensors here, one DCP shard per rank.
SHARDED_DIR = "sharded"
_MARKERS = (MANIFEST_FILE, STATE_FILE, LEGACY_STATE_FILE)
_HASH_CHUNK = 1 << 20
# What decoding a malformed state can raise (json, int(), the generators' setstate, numpy's uint32).
_DECODE_ERRORS = (ValueError, KeyError, TypeError, AttributeError, RuntimeError, OverflowError)


# The fall-backs already said in this process (see `_resolve`).
_SAID_FALLBACKS: set[tuple] = set()


class CheckpointError(OmniConfigError, FileNotFoundError):
    """No usable checkpoint where `trainer.resume` points, or one that does not fit the run."""


# --- RNG -------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _rng_to_json(state: dict[str, Any]) -> dict[str, Any]:
    version, internal, gauss_next = state["python"]
    name, keys, pos, has_gauss, cached = state["numpy"]
    return {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
        "numpy": {"name": name, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "torch": bytes(state["torch"].tolist()).hex(),
    }


def _rng_from_json(raw: dict[str, Any]) -> dict[str, Any]:
    """The RNG states of `_rng_to_json`, checked by loading each into a spare generator."""
    py, npy = raw["python"], raw["numpy"]
    gauss = py["gauss_next"]
    state = {
        "python": (int(py["version"]), tuple(int(x) for x in py["state"]), None if gauss is None else float(gauss)),
        "numpy": (str(npy["name"]), np.array(npy["keys"], dtype=np.uint32), int(npy["pos"]), int(npy["has_gauss"]),
                  float(npy["cached_gaussian"])),
        "torch": torch.tensor(list(bytes.fromhex(raw["torch"])), dtype=torch.uint8),
    }
    random.Random().setstate(state["python"])
    np.random.RandomState().set_state(state["numpy"])
    torch.Generator().set_state(state["torch"])
    return state


# --- saving ----------------------------------------------------------------------------------
def checkpoint_dir(output_dir: Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def write_checkpoint(output_dir: Path, step: int, model, config_yaml: str, keep_last: int,
                     write_weights: Callable[[Path], dict[str, Any]], pipeline=None,
                     protect: Optional[Path] = None) -> Path:
    """The one way a checkpoint folder is made, for every backend.

    `write_weights(folder)` writes the backend's tensors and export and returns its
    `trainer_state.json` keys; this adds the step, RNG states, tensor names, the config, the
    producer's in-flight units and the manifest last, then prunes (never `protect`).
    """
    rng = rng_state()
    target = checkpoint_dir(output_dir, step)
    with atomic_directory(target) as tmp:
        extra = write_weights(tmp)
        if pipeline is not None and pipeline.meta["units"]:
            atomic_save_safetensors({k: v.detach().cpu().contiguous() for k, v in pipeline.tensors.items()},
                                    tmp / PIPELINE_FILE)
            extra = {**extra, "pipeline": pipeline.meta}
        state = {
            "format": FORMAT_VERSION,
            "step": step,
            "rng": _rng_to_json(rng),
            "trainable_tensors": {n: list(t.shape) for n, t in model.named_trainable_tensors().items()},
            **extra,
        }
        atomic_write_json(tmp / STATE_FILE, state)
        atomic_write_text(tmp / CONFIG_FILE, config_yaml)
        write_manifest(tmp)
    prune_checkpoints(output_dir, keep_last, newest=target, protect=protect)
    return target


def save_checkpoint(output_dir: Path, step: int, state: dict[str, Any], model, config_yaml: str, keep_last: int,
                    pipeline=None, family_tensors: Optional[dict[str, torch.Tensor]] = None,
                    protect: Optional[Path] = None, ema_tensors: Optional[dict[str, torch.Tensor]] = None,
                    ema_meta: Optional[dict[str, Any]] = None) -> Path:
    """A one-process checkpoint: `state` is `LocalEngine.state_dict()` (trainable tensors, optimizer);
    `family_tensors` the model family's own state (`ModelFamily.state_tensors`), if any;
    `ema_tensors` and `ema_meta` the run's EMA of the weights (`WeightEMA`), if it keeps one."""

    def write_weights(folder: Path) -> dict[str, Any]:
        tensors, optimizer = _split_engine_state(state)
        extra = {f"{FAMILY_PREFIX}{k}": v.detach().cpu().contiguous() for k, v in (family_tensors or {}).items()}
        ema = {f"{EMA_PREFIX}{k}": v.detach().cpu().contiguous() for k, v in (ema_tensors or {}).items()}
        atomic_save_safetensors({**tensors, **extra, **ema}, folder / TENSORS_FILE)
        model.save_trained(str(folder / export_folder(model)))
        written = {"optimizer": optimizer}
        if extra:
            written["family_tensors"] = sorted(family_tensors)
        if ema_tensors is not None:
            written["ema"] = {**(ema_meta or {}), "tensors": sorted(ema_tensors)}
        return written

    return write_checkpoint(output_dir, step, model, config_yaml, keep_last, write_weights, pipeline, protect)


def _split_engine_state(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors for safetensors; the optimizer's param_groups and scalar state for JSON."""
    tensors = {f"trainable/{k}": v.detach().cpu().contiguous() for k, v in state["trainable"].items()}
    optimizer = state["optimizer"]
    scalars: dict[str, dict[str, Any]] = {}
    for index, entries in optimizer["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{index}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": optimizer["param_groups"], "state": scalars}


def _join_engine_state(tensors: dict[str, torch.Tensor], optimizer: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """`LocalEngine.state_dict()` back from `_split_engine_state`'s two halves."""
    trainable = {k.removeprefix("trainable/"): v for k, v in tensors.items() if k.startswith("trainable/")}
    if sorted(trainable) != sorted(names):
        raise ValueError(f"{len(trainable)} trainable tensors, but {STATE_FILE} lists {len(names)}")
    opt_state: dict[int, dict[str, Any]] = {int(i): dict(v) for i, v in optimizer["state"].items()}
    for key, value in tensors.items():
        if key.startswith("optimizer/"):
            _, index, name = key.split("/", 2)
            opt_state.setdefault(int(index), {})[name] = value
    # JSON has no tuples; torch optimizers keep them in param_groups (AdamW's betas).
    groups = [{k: (tuple(v) if isinstance(v, list) and k != "params" else v) for k, v in g.items()}
              for g in optimizer["param_groups"]]
    for group in groups:
        if not all(isinstance(i, int) for i in group["params"]):
            raise ValueError("optimizer param_groups: params must be integer indices")
    return {"trainable": trainable, "optimizer": {"state": opt_state, "param_groups": groups}}


def write_manifest(folder: Path) -> Path:
    """`manifest.json`: size and sha256 of every file under `folder` (call it last)."""
    files = {}
    for path in sorted(Path(folder).rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and rel != MANIFEST_FILE:
            files[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return atomic_write_json(Path(folder) / MANIFEST_FILE, {"format": FORMAT_VERSION, "files": files})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def prune_checkpoints(output_dir: Path, keep_last: int, newest: Optional[Path] = None,
                      protect: Optional[Path] = None) -> None:
    """Keep `newest` (the checkpoint just written) and the `keep_last - 1` before it; 0 keeps all.

    Called only after the new checkpoint is in place. Checkpoints of a higher step than `newest`
    are not this run's and stay; of those to go a damaged one goes first, and `protect` (the one the
    run resumed from) never goes. A folder is renamed before it is deleted, so a kill mid-delete
    leaves a temporary for `leftovers`, not a checkpoint without tensors.
    """
    if keep_last <= 0:
        return
    found = list_checkpoints(output_dir)
    candidates = found if newest is None else [p for p in found if _step_of(p) < _step_of(Path(newest))]
    keep = keep_last if newest is None else keep_last - 1
    excess = max(len(candidates) - keep, 0)
    # Damaged first, then oldest first.
    ranked = sorted(candidates, key=lambda p: (not is_damaged(p), _step_of(p)))
    kept = protect.resolve() if protect is not None else None
    doomed = [p for p in ranked[:excess] if p.resolve() != kept]
    for old in doomed:
        doomed_name = old.with_name(f".{old.name}.{secrets.token_hex(4)}.tmp")  # a name leftovers removes
        try:
            os.replace(old, doomed_name)
        except OSError:
            continue
        shutil.rmtree(doomed_name, ignore_errors=True)


def is_damaged(folder: Path) -> bool:
    """Whether a checkpoint folder is certainly unusable, checked cheaply: its manifest is
    missing (and it is no old-format checkpoint) or unreadable, or a file it lists is missing
    or has another size. Hashes are not read (`verify_checkpoint` does that)."""
    manifest = Path(folder) / MANIFEST_FILE
    if not manifest.is_file():
        return not (Path(folder) / LEGACY_STATE_FILE).is_file()
    try:
        files = json.loads(manifest.read_text())["files"]
        return any(not (folder / rel).is_file() or (folder / rel).stat().st_size != int(e["size"])
                   for rel, e in files.items())
    except (OSError, *_DECODE_ERRORS):
        return True


def export_folder(model) -> str:
    """Where a run's trained weights go: `lora` for LoRA runs, `model` for full fine-tuning."""
    return "lora" if model.cfg.lora.enabled else "model"


# --- finding and loading ---------------------------------------------------------------------
def _step_of(folder: Path) -> int:
    return int(_STEP_DIR.match(folder.name).group(1))


def _is_checkpoint(folder: Path) -> bool:
    return any((folder / marker).is_file() for marker in _MARKERS)


def list_checkpoints(output_dir: Path) -> list[Path]:
    """The checkpoint folders of an output folder, oldest first (verified or not)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and p.is_dir() and _is_checkpoint(p)]
    return sorted(found, key=_step_of)


def find_checkpoint(path: str, setting: str = "trainer.resume") -> Path:
    """The verified checkpoint folder `path` names (see `load_checkpoint`)."""
    return Path(_resolve(path, setting)["folder"])


def check_resume(path: str | None) -> None:
    """`trainer.resume` is a checkpoint folder, or an output folder with checkpoints (else
    `CheckpointError`), checked before any model loads (`omni_rl.cli.check_inputs`)."""
    if not path:
        return
    expected = "a checkpoint folder (OUTPUT/checkpoints/step_NNNNNN) or a run's output folder"
    folder = Path(path).expanduser()
    if not folder.exists():
        raise CheckpointError(f"trainer.resume={path!r}: no such folder; expected {expected}")
    if not folder.is_dir():
        raise CheckpointError(f"trainer.resume={path!r} is a file; expected {expected}")
    find_checkpoint(path)


def load_checkpoint(path: str) -> dict[str, Any]:
    """The state of the checkpoint `path` names, verified against its manifest.

    `path` is a checkpoint folder (which must verify) or an output folder (its newest checkpoint
    that verifies, with a warning naming any newer one that does not). Returns `trainer_state.json`'s
    entries with `folder`, `config` and, for a one-process checkpoint, `trainable`, `optimizer`,
    `family` and `ema_tensors`.
    """
    return _resolve(path, "trainer.resume")


def _resolve(path: str, setting: str) -> dict[str, Any]:
    p = Path(path).expanduser()
    if _is_checkpoint(p):  # the user named this one: no fall-back
        try:
            return read_checkpoint(p)
        except CheckpointError as err:
            if not (p / MANIFEST_FILE).is_file():
                raise  # the message says what to do (an old format, or an unfinished save)
            raise CheckpointError(
                f"{setting}={path!r}: {err}; resume from another checkpoint, or from the output folder "
                f"(its newest checkpoint that verifies)"
            ) from err
    found = list_checkpoints(p)
    if not found and _is_run_output(p):
        raise CheckpointError(
            f"{setting}={path!r}: no checkpoint yet: the run there stopped before its first save "
            f"(trainer.save_every), so there is nothing to resume; start again with trainer.overwrite=true and "
            f"without {setting} (its outputs are moved aside, not deleted)"
        )
    if not found:
        raise CheckpointError(
            f"{setting}={path!r}: no checkpoint there (expected a folder with {MANIFEST_FILE}, "
            f"or an output folder with checkpoints/step_NNNNNN/)"
        )
    failures: list[tuple[Path, CheckpointError]] = []
    for folder in reversed(found):
        try:
            state = read_checkpoint(folder)
        except CheckpointError as err:
            failures.append((folder, err))
            continue
        # Said once a process: the CLI's check, the run folder and the trainer each resolve it.
        said = (setting, str(path), str(folder), tuple(str(f) for f, _ in failures))
        if failures and said not in _SAID_FALLBACKS:
            _SAID_FALLBACKS.add(said)
            for bad, err in failures:
                log.warning("%s=%s: skipping %s, which fails verification: %s", setting, path, bad.name, err)
            log.warning("%s=%s: falling back to %s (step %d), the newest checkpoint there that verifies",
                        setting, path, folder, state["step"])
        return state
    newest, err = failures[0]
    raise CheckpointError(
        f"{setting}={path!r}: none of its {len(found)} checkpoints verifies; the latest, {newest.name}: {err}"
    )


def _is_run_output(folder: Path) -> bool:
    """Whether `folder` is a run's output folder (what a run writes at its start or first step)."""
    return any((folder / name).exists() for name in (CONFIG_FILE, "metrics.jsonl", ".omni_rl.lock"))


def read_checkpoint(folder: Path) -> dict[str, Any]:
    """One checkpoint folder, verified and decoded; `CheckpointError` names the bad file."""
    folder = Path(folder)
    listed = verify_checkpoint(folder)
    state_path = folder / STATE_FILE
    try:
        raw = json.loads(state_path.read_text())
        if raw.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT_VERSION}")
        step = raw["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step {step!r}, expected an integer >= 0")
        state = {
            **raw,
            "rng": _rng_from_json(raw["rng"]),
            "trainable_tensors": {str(n): [int(d) for d in s] for n, s in raw["trainable_tensors"].items()},
        }
        if "sharded" in raw and raw["sharded"] != SHARDED_DIR:
            raise ValueError(f"sharded={raw['sharded']!r}, expected {SHARDED_DIR!r}")
    except _DECODE_ERRORS as err:
        raise CheckpointError(f"{state_path}: not a valid trainer state ({_describe(err)})") from err
    state["config"] = _read_config(folder / CONFIG_FILE)
    # Read only what the manifest vouches for.
    needed = f"{SHARDED_DIR}/.metadata" if "sharded" in state else TENSORS_FILE
    if needed not in listed:
        raise CheckpointError(f"{folder / MANIFEST_FILE}: does not list {needed}, which {STATE_FILE} needs")
    if "sharded" in state:
        check_dcp_metadata(folder / SHARDED_DIR / ".metadata")
    else:
        state.update(_read_tensors(folder / TENSORS_FILE, raw, state_path))
    if "pipeline" in raw:
        state["pipeline_tensors"] = _read_pipeline(folder, raw["pipeline"], listed, state_path)
    state["folder"] = str(folder)
    return state


def _read_pipeline(folder: Path, meta: Any, listed: set[str], state_path: Path) -> dict[str, torch.Tensor]:
    """The tensors of the versions the in-flight rollouts used, checked against `pipeline`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if PIPELINE_FILE not in listed:
        raise CheckpointError(f"{folder / MANIFEST_FILE}: does not list {PIPELINE_FILE}, which {STATE_FILE} needs")
    try:
        tensors = load_file(folder / PIPELINE_FILE, device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{folder / PIPELINE_FILE}: not a readable safetensors file ({err})") from err
    check_finite(tensors, folder / PIPELINE_FILE)
    try:
        versions = {str(int(version)) for _index, version in meta["units"]}
        if versions - set(meta["kinds"]) or versions - {k.split("/", 1)[0] for k in tensors}:
            raise ValueError(f"versions {sorted(versions)} without their kind or tensors")
    except _DECODE_ERRORS as err:
        raise CheckpointError(f"{state_path}: its pipeline entry does not fit {PIPELINE_FILE} ({_describe(err)})") from err
    return tensors


def _read_tensors(path: Path, raw: dict[str, Any], state_path: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from err
    check_finite(tensors, path)
    try:
        state = _join_engine_state(tensors, raw["optimizer"], list(raw["trainable_tensors"]))
        family = {k.removeprefix(FAMILY_PREFIX): v for k, v in tensors.items() if k.startswith(FAMILY_PREFIX)}
        listed = sorted(str(k) for k in raw.get("family_tensors", []))
        if sorted(family) != listed:
            raise ValueError(f"{len(family)} family tensors, but {STATE_FILE} lists {len(listed)}")
        state["family"] = family
        ema = {k.removeprefix(EMA_PREFIX): v for k, v in tensors.items() if k.startswith(EMA_PREFIX)}
        if "ema" in raw:
            listed = sorted(str(k) for k in raw["ema"]["tensors"])
            if sorted(ema) != listed:
                raise ValueError(f"{len(ema)} EMA tensors, but {STATE_FILE} lists {len(listed)}")
            int(raw["ema"]["optimizer_steps"])  # a bad count fails here, not at resume
            state["ema_tensors"] = ema
        elif ema:
            raise ValueError(f"{len(ema)} EMA tensors, but {STATE_FILE} has no ema entry")
        return state
    except _DECODE_ERRORS as err:
        raise CheckpointError(f"{state_path} and {path} do not agree ({_describe(err)})") from err


def checkpoint_ema_tensors(state: dict[str, Any]) -> Optional[dict[str, torch.Tensor]]:
    """The EMA of the trained weights in a checkpoint `load_checkpoint` returned, named like
    `OmniModelBase.named_trainable_tensors()` (so `model.load_named_tensors` takes it; fp32 on
    the CPU), or None where the run kept none (`trainer.backend_options.ema_decay` unset, or a
    sharded checkpoint). DiffusionNFT's old-policy EMA (`state["family"]`) is not this one."""
    return state.get("ema_tensors")


def check_finite(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """CheckpointError naming `path` and the first floating-point tensor holding a NaN or an
    infinity: weights or optimizer moments of a run that diverged (or a file edited and re-signed)
    would resume into NaN losses or a sampler's failure steps later, whatever the model family."""
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            continue
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            bad = int(finite.numel() - finite.sum())
            raise CheckpointError(
                f"{path}: tensor {name!r} holds {bad} NaN or infinite value{'s' if bad > 1 else ''} (of "
                f"{tensor.numel()}): the run that wrote it diverged, or the file was changed"
            )


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: not a readable config ({err})") from err
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a YAML mapping, got {type(config).__name__}")
    return config


def _describe(err: Exception) -> str:
    return f"missing key {err}" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"


def verify_checkpoint(folder: Path) -> set[str]:
    """Check every file of `folder` against its manifest (size, then sha256); returns the
    files it lists (relative paths)."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        if (folder / LEGACY_STATE_FILE).is_file():
            exports = [name for name in ("lora", "model") if (folder / name).is_dir()]
            where = f"; its trained weights are in {folder / exports[0]}, readable without omni-rl" if exports else ""
            raise CheckpointError(
                f"{folder / LEGACY_STATE_FILE}: a checkpoint in the pickle format of earlier omni-rl versions, "
                f"which is no longer loaded (unpickling can run arbitrary code); re-run the training with this "
                f"version to get a resumable checkpoint{where}"
            )
        raise CheckpointError(
            f"{manifest_path}: missing, so {folder} cannot be verified (a save that did not finish, or a "
            f"partial copy); resume from another checkpoint"
        )
    try:
        files = json.loads(manifest_path.read_text())["files"]
        entries = [(str(rel), int(e["size"]), str(e["sha256"])) for rel, e in files.items()]
    except _DECODE_ERRORS as err:
        raise CheckpointError(f"{manifest_path}: not a valid manifest ({_describe(err)})") from err
    listed = {rel for rel, _, _ in entries}
    for required in (STATE_FILE, CONFIG_FILE):
        if required not in listed:
            raise CheckpointError(f"{manifest_path}: does not list {required}; not a checkpoint of this version")
    for rel, size, sha256 in entries:
        parts = PurePosixPath(rel).parts
        if PurePosixPath(rel).is_absolute() or ".." in parts:
            raise CheckpointError(f"{manifest_path}: lists {rel!r}, a path outside the checkpoint folder")
        path = folder / rel
        if not path.is_file():
            raise CheckpointError(f"{path}: missing, though {MANIFEST_FILE} lists it")
        actual = path.stat().st_size
        if actual != size:
            raise CheckpointError(
                f"{path}: {actual} bytes, {MANIFEST_FILE} says {size}: the file was truncated or overwritten"
            )
        if _sha256(path) != sha256:
            raise CheckpointError(
                f"{path}: its sha256 differs from the one in {MANIFEST_FILE}: the file is corrupt (a bit flip, "
                f"a bad copy or an edit)"
            )
    return listed


# DCP writes its `.metadata` with pickle; these are the globals it holds (torch 2.x). Anything
# else (an `os.system` planted in a __reduce__, say) is refused before a worker unpickles it.
_DCP_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("collections", "OrderedDict"),
    ("pathlib", "Path"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
}
_DCP_MODULES = ("torch.distributed.checkpoint.metadata",)


class _DcpMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _DCP_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module in _DCP_MODULES:
            found = super().find_class(module, name)
            if isinstance(found, type) and found.__module__ == module:
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not something DCP metadata holds")


def check_dcp_metadata(path: Path) -> None:
    """Refuse a `sharded/.metadata` that needs more than DCP's own classes to unpickle."""
    try:
        _DcpMetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except Exception as err:  # noqa: BLE001  (whatever the bytes make pickle raise: refuse)
        raise CheckpointError(f"{path}: not DCP metadata omni-rl can load safely ({_describe(err)})") from err


# --- compatibility ---------------------------------------------------------------------------
_COMPAT_KEYS = ("adapter", "path", "stage", "lora.enabled")
_LORA_KEYS = ("lora.rank", "lora.alpha", "lora.target_modules")


def check_compatible(state: dict[str, Any], cfg, model) -> None:
    """Refuse a checkpoint whose model settings or trainable tensors differ from this run's.

    Compared: model.adapter, path, stage, lora.enabled and, with LoRA on, lora.rank, alpha and
    target_modules (as sets; where one side is null, the adapter's default, the tensor names
    decide); then the names and shapes of the trainable tensors.
    """
    folder = state["folder"]
    saved_model = state["config"].get("model")
    current = dataclasses.asdict(cfg.model)
    keys = _COMPAT_KEYS + (_LORA_KEYS if cfg.model.lora.enabled else ())
    undecided = []  # settings that differ only by a null (the adapter's default): the tensors decide
    for key in keys:
        if not isinstance(saved_model, dict):
            break
        saved, now = _lookup(saved_model, key), _lookup(current, key)
        if saved is _ABSENT or _same_setting(key, saved, now):
            if saved is not _ABSENT and saved != now:
                undecided.append(f"model.{key}={_show(saved)} there, {_show(now)} here")
            continue
        raise CheckpointError(
            f"trainer.resume: {folder} was trained with model.{key}={_show(saved)}, this run has "
            f"model.{key}={_show(now)}; resume with model.{key}={_show(saved)}, or start a new run without "
            f"trainer.resume"
        )
    saved_shapes = state["trainable_tensors"]
    shapes = {n: list(t.shape) for n, t in model.named_trainable_tensors().items()}
    missing = sorted(set(shapes) - set(saved_shapes))
    extra = sorted(set(saved_shapes) - set(shapes))
    other = sorted(n for n in set(shapes) & set(saved_shapes) if shapes[n] != saved_shapes[n])
    if missing or extra or other:
        parts = []
        if missing:
            parts.append(f"{len(missing)} of this model's trainable tensors are not in the checkpoint (e.g. "
                         f"{missing[0]!r})")
        if extra:
            parts.append(f"{len(extra)} of the checkpoint's trainable tensors are not in this model (e.g. {extra[0]!r})")
        if other:
            parts.append(f"{len(other)} differ in shape (e.g. {other[0]!r}: {saved_shapes[other[0]]} saved, "
                         f"{shapes[other[0]]} here)")
        # What decides which tensors train besides the keys above: the adapter's options
        # (model.adapter_options.trainable on the talker).
        changed = _changed_options(saved_model, current)
        if undecided or changed:
            parts.append("; ".join(undecided + [f"model.adapter_options.{k}={_show(a)} there, {_show(b)} here"
                                                for k, a, b in changed]))
        settings = ", ".join(f"model.adapter_options.{k}={_show(a)}" for k, a, _ in changed)
        raise CheckpointError(
            f"trainer.resume: the trainable tensors of {folder} do not fit this model: {'; '.join(parts)}; "
            f"resume with the model settings of {Path(folder) / CONFIG_FILE}" + (f" ({settings})" if settings else "")
        )


_ABSENT = object()


def _changed_options(saved_model: Any, current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, saved, now) of each `model.adapter_options` entry set differently there and here."""
    # A checkpoint written before the block was renamed (issue 39) keeps it as `options`.
    saved = (saved_model.get("adapter_options", saved_model.get("options"))
             if isinstance(saved_model, dict) else None)
    now = current.get("adapter_options") or {}
    if not isinstance(saved, dict):
        return []
    return [(k, saved.get(k), now.get(k)) for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]


def _lookup(tree: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def _same_setting(key: str, saved: Any, now: Any) -> bool:
    if key == "lora.target_modules":
        return saved is None or now is None or sorted(map(str, saved)) == sorted(map(str, now))
    if key == "lora.alpha":
        return isinstance(saved, (int, float)) and float(saved) == float(now)
    return saved == now


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def latest_step(output_dir: Path) -> Optional[int]:
    found = list_checkpoints(output_dir)
    return _step_of(found[-1]) if found else None

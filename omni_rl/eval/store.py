"""An evaluation's folder: what it is of, each prompt's record as it finishes, and the result.

`<out>/run.json` (benchmark, protocol, model identity), `prompts/NNNNNN.json` (one row's
record), `samples/`, `grids/` and `results.json` (once every row is done). Every file is written
atomically, so a rerun skips recorded rows and shards may share a folder; a folder of another
evaluation is refused before any model loads.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Optional

from omni_rl.errors import OmniConfigError
from omni_rl.eval.protocol import differences
from omni_rl.utils.atomic import atomic_write_json

RUN_FILE = "run.json"
RESULTS_FILE = "results.json"


class EvalFolderError(OmniConfigError):
    """The output folder holds another evaluation, or cannot be used."""


def record_path(out: Path, index: int) -> Path:
    return out / "prompts" / f"{index:06d}.json"


def sample_path(out: Path, index: int, sample: int, suffix: str = ".png") -> Path:
    return out / "samples" / f"{index:06d}_{sample}{suffix}"


def open_folder(out: Path, run: dict[str, Any]) -> None:
    """Claim `out` for the evaluation `run` describes (run.json), or check that it is that one."""
    if out.exists() and not out.is_dir():
        raise EvalFolderError(f"--eval-out {str(out)!r} is a file; expected a folder (new, or an earlier run of this evaluation)")
    existing = out / RUN_FILE
    if existing.is_file():
        try:
            old = json.loads(existing.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise EvalFolderError(f"{existing} is unreadable ({err}); choose another --eval-out") from None
        diffs = [f"{key} ({'; '.join(differences(old.get(key) or {}, run[key])[:2])})" if isinstance(run[key], dict)
                 else f"{key} {old.get(key)!r} vs {run[key]!r}"
                 for key in ("benchmark", "protocol", "model", "prompt_file") if _canon(old.get(key)) != _canon(run[key])]
        if diffs:
            raise EvalFolderError(
                f"--eval-out {str(out)!r} holds another evaluation (its {', '.join(diffs)}); its finished samples are "
                f"kept: choose another --eval-out for this one")
        return
    if out.is_dir() and any(out.iterdir()):
        raise EvalFolderError(f"--eval-out {str(out)!r} is a folder with other files and no {RUN_FILE}; "
                              f"choose a new folder for the evaluation")
    atomic_write_json(existing, run)


def done_rows(out: Path) -> set[int]:
    folder = out / "prompts"
    if not folder.is_dir():
        return set()
    return {int(p.stem) for p in folder.glob("[0-9]*.json") if p.stem.isdigit()}


def write_record(out: Path, record: dict[str, Any]) -> None:
    atomic_write_json(record_path(out, record["index"]), record)


def read_records(out: Path, rows: Optional[Iterable[int]] = None) -> list[dict[str, Any]]:
    wanted = sorted(done_rows(out) if rows is None else rows)
    return [json.loads(record_path(out, i).read_text()) for i in wanted]


def write_results(out: Path, results: dict[str, Any]) -> Path:
    return atomic_write_json(out / RESULTS_FILE, results)


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True)

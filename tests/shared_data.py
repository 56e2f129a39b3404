"""The field's real prompt files for tests, read from `../shared/datasets/` beside the checkout.

They are public files of other projects (GenEval's metadata, Flow-GRPO's test sets; that folder's
SOURCE.md names each one's repository, commit and licence) and are never copied into this
project. `shared_dataset("geneval/evaluation_metadata.jsonl")` returns the file's path, or skips
the calling test with a reason where the folder or the file is absent.
"""
from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def shared_dataset(relative: str) -> Path:
    """The path of `relative` under `../shared/datasets/`, or a skip naming what is missing."""
    path = SHARED_DATASETS / relative
    if not path.is_file():
        pytest.skip(f"the real prompt file {relative} is not here ({SHARED_DATASETS} is where the project's "
                    f"shared data folder lies beside the checkout); the test reads it from there")
    return path

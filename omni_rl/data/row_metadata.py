"""A row's fields beside its prompt -> the rewards' metadata (the plain `.jsonl` and chat readers).

The field's prompt files keep a row's data at the top level, not in a `metadata` object:
GenEval's `{"tag", "include", "exclude", "prompt"}` rows (djghosh13/geneval, Flow-GRPO's
`dataset/geneval/`), Flow-Factory's sudoku `{"prompt", "puzzle", "solution"}`, verl-omni's
Parquet columns `data_source`, `ability`, `reward_model`, `extra_info`. Flow-Factory packs every
column that is not a model input into its samples' metadata; omni-rl does the same, so that a
reward receives every field of its row:

    row_metadata(row, consumed, where)
      = {**row["metadata"], **{key: row[key] for key in row if key not in consumed}}

`consumed` are the keys the reader turned into the item itself (`prompt`, the media fields) and
`metadata`. A null field counts as absent. A top-level key that the `metadata` object also holds
is refused (`PromptFileError` naming `where`, the row) when the two values differ, and kept once
when they are equal: which of two answers is the real one is not a reader's guess.

Values are kept as the file gives them (JSON values; Parquet rows as pyarrow's `to_pylist`
gives them, structs as dicts).
"""
from __future__ import annotations

from typing import Any, Iterable

from omni_rl.data.prompt_item import PromptFileError


def row_metadata(row: dict[str, Any], consumed: Iterable[str], where: str) -> dict[str, Any]:
    """The metadata of one row (rules in the module docstring); `where` ("file: row N" or
    "file:N") prefixes every error."""
    metadata = row.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise PromptFileError(f"{where}: 'metadata' must be an object, got {type(metadata).__name__}")
    merged = dict(metadata)
    skip = {*consumed, "metadata"}
    for key, value in row.items():
        if key in skip or value is None:
            continue
        if key in merged and merged[key] != value:
            raise PromptFileError(
                f"{where}: field {key!r} is {_short(value)} but metadata.{key} is {_short(merged[key])}; "
                f"a row's top-level fields and its 'metadata' object both reach the rewards' metadata, "
                f"so give {key!r} once"
            )
        merged[key] = value
    return merged


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."

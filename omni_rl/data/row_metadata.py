"""A row's fields beside its prompt -> the rewards' metadata (the plain `.jsonl` and chat readers).

Peers' files keep a row's data at the top level (GenEval's `tag` / `include` / `exclude`,
verl-omni's `reward_model`, ...), so every field reaches the rewards:
`row_metadata(row, consumed, where) = {**row["metadata"], **(the row's other fields)}`. A null
field is absent; a key given at both levels with two values is refused (`PromptFileError`).
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

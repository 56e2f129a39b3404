"""`RewardScores`: a scorer's scores with a per-sample breakdown into metric groups.

    return RewardScores(scores=[1.0, 0.0, 1.0], groups=["geneval/counting", "geneval/position", None])

The `RewardManager` logs each group's mean as `reward/<group>` and numeric `details` fields below it.
A group key has two parts or more, the first neither "total" nor a configured reward's name.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

_KEY = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$")


@dataclass
class RewardScores:
    """scores: one float per sample (a list, 1-D array or tensor, as a plain scorer returns);
    groups: one metric group key per sample, or None for a sample in no group."""

    scores: Any
    groups: Sequence[Optional[str]]
    details: Optional[Sequence[Mapping[str, Any]]] = None


def check_groups(groups: Any, n: int, reserved: set[str]) -> Optional[str]:
    """Why `groups` is no valid breakdown of n samples (None when it is one)."""
    if isinstance(groups, str) or not isinstance(groups, Sequence) or len(groups) != n:
        return f"RewardScores.groups must be a list of {n} group keys (or None), one per sample; got {groups!r:.80}"
    for i, key in enumerate(groups):
        if key is None:
            continue
        if not isinstance(key, str) or not _KEY.match(key):
            return f"group {key!r} of sample {i} is not a metric path like 'geneval/counting'"
        if key.split("/", 1)[0] in reserved:
            return (f"group {key!r} of sample {i} would shadow the metrics reward/{key.split('/', 1)[0]}/...; "
                    f"start it with a name that is no configured reward and not 'total'")
    return None


def group_means(pairs: Sequence[tuple[str, float]]) -> dict[str, float]:
    """{"reward/<group>": mean score} over (group, score) pairs."""
    by_group: dict[str, list[float]] = {}
    for key, score in pairs:
        by_group.setdefault(key, []).append(score)
    return {f"reward/{key}": float(np.mean(values)) for key, values in sorted(by_group.items())}


def check_details(details: Any, n: int) -> Optional[str]:
    """Why `details` is not one mapping of named values per sample of n (None when it is)."""
    if details is None:
        return None
    if isinstance(details, (str, Mapping)) or not isinstance(details, Sequence) or len(details) != n:
        return f"RewardScores.details must be a list of {n} dicts, one per sample; got {details!r:.80}"
    for i, d in enumerate(details):
        if not isinstance(d, Mapping) or not all(isinstance(k, str) and _KEY.match(f"x/{k}") for k in d):
            return f"details of sample {i} must be a dict with metric-name keys like 'strict_correct'; got {d!r:.80}"
    return None


def detail_pairs(groups: Sequence[Optional[str]], details: Sequence[Mapping[str, Any]]) -> list[tuple[str, float]]:
    """("<group>/<field>", value) for each numeric field of each grouped sample's details, the
    input of `group_means` for the `reward/<group>/<field>` metrics."""
    return [(f"{key}/{name}", float(value)) for key, d in zip(groups, details) if key is not None
            for name, value in d.items() if isinstance(value, (bool, int, float))]

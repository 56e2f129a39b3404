"""`RewardScores`: a scorer's scores with a per-sample breakdown into metric groups.

A scorer returns one float per sample. One that also knows what kind of sample each was (the
GenEval task type of its prompt, a benchmark's category) returns a `RewardScores` instead:

    return RewardScores(scores=[1.0, 0.0, 1.0], groups=["geneval/counting", "geneval/position", None])

and the `RewardManager` reports, besides `reward/<name>/mean|std`, the mean raw score of each
group over the batch's samples in it, as `reward/<group>` (here `reward/geneval/counting` = 1.0
and `reward/geneval/position` = 0.0; a sample whose group is None is in none). A group absent
from a batch has no metric on that step. `AsyncRewardScorer` keeps each sample's group, so the
step's metric is the mean over the whole step, not over a micro-batch.

A group key is a path of at least two parts ("geneval/counting"); its first part may not be
"total" or the name of a configured reward, whose `reward/<name>/...` metrics it would shadow.
A scorer that breaks these rules fails like one that returns a wrong number of scores. Two
rewards of one run should not report the same group: the metric would hold the later one's mean.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

_KEY = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$")


@dataclass
class RewardScores:
    """scores: one float per sample (a list, 1-D array or tensor, as a plain scorer returns);
    groups: one metric group key per sample, or None for a sample in no group."""

    scores: Any
    groups: Sequence[Optional[str]]


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

"""Contiguous shards of n items: the row ranges a batch is split into across workers or actors."""
from __future__ import annotations


def split_evenly(n: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) index ranges of `parts` contiguous shards of n items (sizes differ by <= 1)."""
    base, extra = divmod(n, parts)
    bounds, lo = [], 0
    for r in range(parts):
        hi = lo + base + (1 if r < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds

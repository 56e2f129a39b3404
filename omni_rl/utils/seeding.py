"""Seeds derived from (run seed, purpose, step, index), independent of execution order.

Every random choice of a run (a sample's noise, a mini-batch shuffle) takes its seed from here,
so that resuming at step k reproduces steps k+1... exactly, and a sample's randomness does not
depend on which other samples ran before it.
"""
from __future__ import annotations

import numpy as np


def derive_seed(base: int, purpose: str, *parts: int) -> int:
    """A 63-bit seed from the run seed, a purpose label and integer coordinates."""
    words = [int(base) & 0xFFFFFFFF, *[ord(c) for c in purpose], *[int(p) & 0xFFFFFFFF for p in parts]]
    low, high = (int(w) for w in np.random.SeedSequence(words).generate_state(2, dtype=np.uint32))
    return ((high << 32) | low) & (2**63 - 1)

"""`WorkerFailedError`: a Ray worker died or stopped answering; the run stops, naming it."""
from __future__ import annotations

from omni_rl.errors import OmniRunError


class WorkerFailedError(OmniRunError):
    """A worker (rank, node, pid) died or timed out during a named call at a named step.

    The message is one line, meant for the command line: which worker, what it was doing, at
    which step, and what to look at next."""

    def __init__(self, message: str, rank: int | None = None, step: int | None = None):
        super().__init__(message)
        self.rank = rank
        self.step = step

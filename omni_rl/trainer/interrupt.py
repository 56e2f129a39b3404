"""SIGTERM and SIGINT during training: finish the step, save it, stop with one line.

Inside `StopOnSignal` the first signal sets a flag; the loop finishes and saves the step (a
half-done step belongs to no checkpoint) and raises `TrainingInterrupted` (exit 128 + the
signal). A second signal ends the process at once. Outside the main thread it does nothing.
"""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Optional

from omni_rl.errors import OmniRunError

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterrupted(OmniRunError):
    """The run stopped on a signal after step `step`; `checkpoint` is where that step was saved
    (None when no step finished in this process). `exit_code` is 128 + the signal number (the
    command line returns it, as it returns every `OmniRunError`'s own)."""

    def __init__(self, signum: int, step: int, checkpoint: Optional[Path], resume_hint: Optional[str] = None):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        if checkpoint is not None:
            text = (f"interrupted by {name} at step {step}; checkpoint saved to {checkpoint} "
                    f"(resume with trainer.resume={checkpoint})")
        elif resume_hint is not None:
            text = (f"interrupted by {name} before step {step + 1} finished; nothing new to save "
                    f"(resume again with trainer.resume={resume_hint})")
        else:
            text = f"interrupted by {name} before step {step + 1} finished; nothing trained yet, so no checkpoint"
        super().__init__(text)


class StopOnSignal:
    """Context manager: while inside, SIGTERM / SIGINT set `signum` instead of ending the
    process; a second one ends it at once. The previous handlers come back on exit."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            # The second signal: the default action, now (for both signals: end the process),
            # said first, as the first signal's notice promised a checkpoint.
            os.write(2, f"error: received {signal.Signals(signum).name} again: stopped at once; no checkpoint was "
                        f"saved for the step in progress (resume from the last saved one, if any)\n".encode())
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        # os.write, not print or logging: the handler may run in the middle of a write to
        # stderr, and a buffered stream refuses to be entered twice.
        name = signal.Signals(signum).name
        os.write(2, f"received {name}: finishing the current step, then saving a checkpoint "
                    f"(send {name} again to stop at once)\n".encode())

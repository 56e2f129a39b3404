"""SIGTERM and SIGINT during training: finish the step, save it, stop with one line.

Cluster schedulers preempt with SIGTERM (then SIGKILL after a grace period); a user stops with
Ctrl-C (SIGINT). Inside `StopOnSignal` the first of either only sets a flag: the loop reads it
after each step, saves a checkpoint of that step and raises `TrainingInterrupted`, which the
command line prints as one `error:` line and turns into exit code 128 + the signal number (143
for SIGTERM, 130 for SIGINT), as a shell reports a process the signal ended. A second signal
ends the process at once (the default action of that signal): whoever sends it means now; one
`error:` line says that no checkpoint was saved for the step in progress.

The current step is finished, not abandoned. Its update changes weights and optimizer state
in place, and the RNG states a checkpoint records are those at the moment of saving; stopping
part-way through a step would leave a state that belongs to no step, and a run resumed from it
would not repeat the uninterrupted one. So a long step (a slow rollout) delays the stop by up
to one step; where a scheduler's grace period is shorter than a step, save periodically
(`trainer.save_every`) so the SIGKILL that follows costs only the steps since the last save.

Signal handlers can only be set in the main thread; elsewhere (a trainer driven from a worker
thread) `StopOnSignal` does nothing and signals keep their usual effect.
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

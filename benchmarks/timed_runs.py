"""One recipe run in a fresh process, timed: the arm that `compile.py`, `compile_learning.py` and
`wait_policy.py` repeat and alternate.

`timed_run` runs `python main_omni.py recipe=R ...` (or another program given the same overrides)
with no validation, no checkpoint, no progress bar and the JSONL logger, under the environment the
caller names, and returns its wall time, the CPU seconds of the child and its threads (bent far
less by the machine's load than the wall time), the load average it started at, and the rows of
its metrics.jsonl. A run past `timeout_s` comes back timed out (its time a lower bound); a run that
fails stops the benchmark with its stderr's tail. Each benchmark keeps its own arms and summary.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
# A run measured for its steps alone: nothing else it would do by default.
QUIET_RUN = ("trainer.val_every=0", "trainer.save_every=0", "trainer.logger_options.progress_bar=false",
             "trainer.loggers=[jsonl]")
# Thread and cache settings a parent may carry, which an arm sets for itself or leaves unset.
ARM_ENV_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "TORCHINDUCTOR_CACHE_DIR")


@dataclass
class TimedRun:
    wall_s: float
    cpu_s: Optional[float]            # the child's user + system seconds, all its threads; None when timed out
    load_at_start: float
    timed_out: bool
    rows: list[dict] = field(default_factory=list)   # metrics.jsonl

    def column(self, key: str) -> list:
        """`key` of every row that has it, in step order."""
        return [r[key] for r in self.rows if r.get(key) is not None]


def arm_env(**settings: str) -> dict[str, str]:
    """This process's environment without the thread and cache settings (`ARM_ENV_KEYS`), plus
    the arm's own."""
    env = {k: v for k, v in os.environ.items() if k not in ARM_ENV_KEYS}
    env.update(settings)
    return env


def timed_run(overrides: Sequence[str], out: Path, env: dict[str, str], timeout_s: float, what: str,
              program: Sequence[str] = ("main_omni.py",)) -> TimedRun:
    """Run `program` with `overrides`, the `QUIET_RUN` ones and `trainer.output_dir=out`; `what`
    names the arm in a failure's message."""
    cmd = [sys.executable, *program, *overrides, *QUIET_RUN, f"trainer.output_dir={out}"]
    load = os.getloadavg()[0]
    before = os.times()
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return TimedRun(wall_s=timeout_s, cpu_s=None, load_at_start=load, timed_out=True)
    wall = time.perf_counter() - start
    after = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"{what}: run failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return TimedRun(wall_s=wall, cpu_s=cpu, load_at_start=load, timed_out=False, rows=rows)

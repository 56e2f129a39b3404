"""benchmarks/timed_runs.py: a run's rows, times and failure, with a small program in the place of
main_omni.py (it receives the same overrides and writes a metrics.jsonl as a run does)."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.timed_runs import QUIET_RUN, arm_env, timed_run  # noqa: E402

# Writes the arguments it got and two steps of metrics into trainer.output_dir, as a run would.
WRITER = """
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(next(a.split("=", 1)[1] for a in args if a.startswith("trainer.output_dir=")))
out.mkdir(parents=True)
rows = [{"step": 1, "timing/step": 0.5, "args": args, "threads": os.environ.get("OMP_NUM_THREADS")},
        {"step": 2, "timing/step": 0.25}]
(out / "metrics.jsonl").write_text("".join(json.dumps(r) + chr(10) for r in rows))
"""


def test_a_run_gives_its_rows_and_times_and_gets_the_quiet_overrides_and_the_arms_env(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    run = timed_run(["recipe=r"], tmp_path / "out", arm_env(OMP_NUM_THREADS="1"), 600, "arm", program=["-c", WRITER])
    assert not run.timed_out and run.wall_s > 0 and run.cpu_s >= 0
    assert run.column("timing/step") == [0.5, 0.25]
    first = run.rows[0]
    assert first["args"][0] == "recipe=r" and set(QUIET_RUN) <= set(first["args"])
    assert first["threads"] == "1"  # the arm's setting, not the parent's 7


def test_a_failed_run_stops_the_benchmark_naming_the_arm_and_its_error(tmp_path):
    with pytest.raises(SystemExit, match=r"2t cold: run failed \(exit 3\): .*broken recipe"):
        timed_run([], tmp_path / "out", arm_env(), 600, "2t cold",
                  program=["-c", "import sys; sys.stderr.write('broken recipe'); sys.exit(3)"])


def test_a_run_past_its_timeout_comes_back_timed_out(tmp_path):
    run = timed_run([], tmp_path / "out", arm_env(), 1, "slow", program=["-c", "import time; time.sleep(120)"])
    assert run.timed_out and run.wall_s == 1 and run.rows == [] and run.cpu_s is None


def test_the_arm_env_drops_the_parents_thread_and_cache_settings(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "somewhere")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    env = arm_env(OMP_NUM_THREADS="2")
    assert "TORCHINDUCTOR_CACHE_DIR" not in env and "OMP_WAIT_POLICY" not in env and env["OMP_NUM_THREADS"] == "2"

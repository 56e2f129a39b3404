"""Step time, samples/s and the reward curve of each `trainer.pipeline` on one recipe and budget.

Each mode trains the same recipe for `--steps` steps in a fresh output folder, as
`python main_omni.py` in a subprocess, with the rollout engine in a process of its own
(`rollout.backend=server`) so that sampling and the update can overlap on a CPU too. Torch threads
are split between the two processes: `--threads` each (OMP_NUM_THREADS, which the rollout server
inherits), 1 + 1 on a 2-core machine. The modes run one after another, in the order given, then
again for each of `--rounds` rounds, so a drifting machine load slows them alike.

    python benchmarks/pipelines.py                                   # tiny_sd3_flowgrpo, 3 modes, 30 steps
    python benchmarks/pipelines.py --recipe tiny_qwen3_grpo --rollout-is token --steps 40

Per mode, over the rounds: `step_s` is the median of the trainer's own `timing/step` over the
steps after `--warmup`; `samples_per_s` the median `perf/samples_per_s` (a step's samples over its
time); `wall_s` the whole run (model builds included); `reward` the per-step mean total reward of
each round, and `rise` omni_rl.logging.rise_report on it (z: the last 20% of steps against the
first 20%, in standard errors); `staleness_max`, `dropped_fraction` the largest over the run.
`step_ratio_vs_on_policy` is each mode's step_s over on_policy's.

Writes JSON (atomically) to --out and prints a short table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from omni_rl.logging import rise_report  # noqa: E402
from omni_rl.utils.atomic import atomic_write_json  # noqa: E402

LEVELS = {"tiny_sd3_flowgrpo": "step", "tiny_qwen3_grpo": "token"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="tiny_sd3_flowgrpo")
    p.add_argument("--modes", nargs="+", default=["on_policy", "one_step_off", "async"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run not counted in step_s")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the trainer and of the rollout server, each")
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--rollout-is", default=None, help="algo.rollout_correction_options.level (default: step for diffusion, token for text)")
    p.add_argument("--override", action="append", default=[], help="extra key=value for every run")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "pipelines.json"))
    return p.parse_args(argv)


def run_mode(args, mode: str, folder: Path) -> dict:
    level = args.rollout_is or LEVELS.get(args.recipe, "none")
    # The staleness bound is an option of the pipelines that sample ahead (on_policy has none).
    staleness = [] if mode == "on_policy" else [f"trainer.pipeline_options.max_staleness={args.max_staleness}"]
    command = [
        sys.executable, str(REPO / "main_omni.py"), f"recipe={args.recipe}", f"trainer.pipeline={mode}",
        *staleness, "rollout.backend=server", f"algo.rollout_correction_options.level={level}",
        f"trainer.total_steps={args.steps}", "trainer.val_every=0", "trainer.save_every=0", "trainer.logger_options.progress_bar=false",
        "trainer.loggers=[jsonl]", f"trainer.output_dir={folder}", *args.override,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "reward/total/mean" in r]
    counted = records[args.warmup:]
    return {
        "wall_s": wall,
        "step_s": statistics.median(r["timing/step"] for r in counted),
        "rollout_s": statistics.median(r["timing/rollout"] for r in counted),
        "update_s": statistics.median(r["timing/update"] for r in counted),
        "samples_per_s": statistics.median(r["perf/samples_per_s"] for r in counted),
        "reward": [r["reward/total/mean"] for r in records],
        "rise": rise_report(folder / "metrics.jsonl"),
        "staleness_max": max(r.get("rollout_corr/staleness_max", 0.0) for r in records),
        "dropped_fraction": max(r.get("rollout_corr/dropped_fraction", 0.0) for r in records),
        "is_weight_max": max(r.get("rollout_corr/is_weight_max", 1.0) for r in records),
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    runs: dict[str, list[dict]] = {m: [] for m in args.modes}
    with tempfile.TemporaryDirectory(prefix="omni-rl-pipelines-") as tmp:
        for r in range(args.rounds):
            for mode in args.modes:
                runs[mode].append(run_mode(args, mode, Path(tmp) / f"{mode}_{r}"))
    summary = {}
    for mode, rs in runs.items():
        summary[mode] = {
            "step_s": statistics.median(x["step_s"] for x in rs),
            "samples_per_s": statistics.median(x["samples_per_s"] for x in rs),
            "wall_s": statistics.median(x["wall_s"] for x in rs),
            "rise_z": [x["rise"]["z"] for x in rs],
            "rose": all(x["rise"]["rose"] for x in rs),
            "staleness_max": max(x["staleness_max"] for x in rs),
            "dropped_fraction": max(x["dropped_fraction"] for x in rs),
        }
    if "on_policy" in summary:
        for mode in summary:
            summary[mode]["step_ratio_vs_on_policy"] = summary[mode]["step_s"] / summary["on_policy"]["step_s"]
    result = {
        "summary": summary,
        "runs": runs,
        "machine": {"cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                    "python": platform.python_version(), "load_1min_at_start": load},
        "settings": {**vars(args), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
    }
    atomic_write_json(Path(args.out), result)
    print(f"{'mode':<14}{'step s':>9}{'ratio':>8}{'samples/s':>11}{'wall s':>9}{'rise z':>10}{'stale max':>11}")
    for mode, s in summary.items():
        z = "/".join(f"{v:.1f}" for v in s["rise_z"])
        print(f"{mode:<14}{s['step_s']:>9.3f}{s.get('step_ratio_vs_on_policy', float('nan')):>8.2f}"
              f"{s['samples_per_s']:>11.1f}{s['wall_s']:>9.1f}{z:>10}{s['staleness_max']:>11.0f}")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()

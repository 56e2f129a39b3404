"""How a tiny recipe's whole run fares on a quiet and on a busy machine, by OpenMP wait policy.

Each run is `python main_omni.py recipe=R` for `--steps` steps in a fresh process (no validation,
no checkpoint, no progress bar). The arms:

- `spin`: libgomp's own default, as before omni-rl set a policy: the child imports torch before
  omni_rl, so the OpenMP runtime starts before the package could set `OMP_WAIT_POLICY`;
- `passive`: the project's default (`OMP_WAIT_POLICY=PASSIVE`, set by `import omni_rl`);
- `passive_1t`: the same with one torch thread (`OMP_NUM_THREADS=1`), to separate the wait
  policy from the thread count a run takes by default.

Conditions: `quiet` (nothing else started), and `loaded`: `--busy` processes spinning on the CPU
beside the run (2 by default, on a 2-core machine a fair share is a third of the cores, so about
3x the quiet time). Rounds alternate every arm in both conditions, so all see the same drift of
the machine's own load; each run records the load average it started at. A run longer than
`--timeout-s` is recorded as timed out (its time a lower bound). Writes JSON atomically to --out:

    python benchmarks/wait_policy.py --recipe tiny_flux_flowgrpo --steps 4 --rounds 2
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `benchmarks.timed_runs` when run as a script

from benchmarks.timed_runs import arm_env, timed_run  # noqa: E402
from omni_rl.utils.atomic import atomic_write_json  # noqa: E402
ARMS = ("spin", "passive", "passive_1t")
# The `spin` arm's child: torch (and with it libgomp) starts before omni_rl can name a policy.
SPIN_ENTRY = "import sys, torch; from omni_rl.cli import main; sys.exit(main(sys.argv[1:]))"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="tiny_flux_flowgrpo")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--busy", type=int, default=2, help="spinning processes in the loaded condition")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "wait_policy.json"))
    return p.parse_args(argv)


def _spin() -> None:
    while True:
        pass


def run_once(args, arm: str, out: Path) -> dict:
    program = ["-c", SPIN_ENTRY] if arm == "spin" else ["main_omni.py"]
    env = arm_env(OMP_NUM_THREADS="1") if arm == "passive_1t" else arm_env()
    run = timed_run([f"recipe={args.recipe}", f"trainer.total_steps={args.steps}"], out, env, args.timeout_s, arm,
                    program=program)
    if run.timed_out:
        return {"wall_s": run.wall_s, "timed_out": True, "load_at_start": run.load_at_start}
    return {"wall_s": run.wall_s, "timed_out": False, "load_at_start": run.load_at_start,
            "step_s": run.column("timing/step"), "rewards": run.column("reward/total/mean")}


def main(argv=None) -> None:
    args = parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="wait_policy_") as tmp:
        for rnd in range(args.rounds):
            for condition in ("quiet", "loaded"):
                busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy if condition == "loaded" else 0)]
                for proc in busy:
                    proc.start()
                try:
                    for arm in args.arms:
                        out = Path(tmp) / f"{arm}_{condition}_{rnd}"
                        result = run_once(args, arm, out)
                        runs.append({"arm": arm, "condition": condition, "round": rnd, **result})
                        print(f"round {rnd} {condition:6s} {arm:10s} {result['wall_s']:7.1f} s"
                              f"{' (timed out)' if result['timed_out'] else ''} load {result['load_at_start']:.1f}", flush=True)
                finally:
                    for proc in busy:
                        proc.terminate()
                        proc.join()
    summary = {}
    for arm in args.arms:
        quiet = statistics.median(r["wall_s"] for r in runs if r["arm"] == arm and r["condition"] == "quiet")
        loaded = statistics.median(r["wall_s"] for r in runs if r["arm"] == arm and r["condition"] == "loaded")
        summary[arm] = {"quiet_s": quiet, "loaded_s": loaded, "loaded_over_quiet": loaded / quiet,
                        "any_timed_out": any(r["timed_out"] for r in runs if r["arm"] == arm)}
    base = summary.get("spin")
    if base:
        for arm in summary:
            summary[arm]["quiet_ratio_to_spin"] = summary[arm]["quiet_s"] / base["quiet_s"]
            summary[arm]["loaded_ratio_to_spin"] = summary[arm]["loaded_s"] / base["loaded_s"]
    result = {
        "benchmark": "wait_policy", "recipe": args.recipe, "steps": args.steps, "rounds": args.rounds,
        "busy_processes": args.busy, "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/wait_policy.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "summary": summary, "runs": runs,
    }
    atomic_write_json(Path(args.out), result)
    for arm, s in summary.items():
        print(f"{arm:10s} quiet {s['quiet_s']:7.1f} s  loaded {s['loaded_s']:7.1f} s  ({s['loaded_over_quiet']:.1f}x)")


if __name__ == "__main__":
    main()

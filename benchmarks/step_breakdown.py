"""Where a training step's time goes, at 1 and 2 torch threads, and whether the rewards stay the same.

Each run trains a recipe (default: `tiny_sd3_flowgrpo`, the fast brightness recipe, not the
demo) for `--steps` steps in a fresh output folder, as a user would (`python main_omni.py ...` in
a subprocess, no validation, no progress bar), with `OMP_NUM_THREADS` set to the thread count.
From its metrics.jsonl it takes the medians, over the steps after `--warmup`, of the trainer's own phase timings
(`timing/rollout`, `timing/reward`, `timing/old_log_prob`, `timing/update`, `timing/weight_sync`
where the code has it, `timing/step`) and the whole reward sequence.

An arm is a checkout of the project: `--arm NAME=PATH` (default: this one). Comparing two
commits in one session, with their runs alternated round by round so that both see the same
machine load, is how a change's effect on step time is measured:

    git worktree add /tmp/before <commit>
    python benchmarks/step_breakdown.py --arm before=/tmp/before --arm after=. --rounds 2
    python benchmarks/step_breakdown.py --arm a=. --arm b=. --arm-override b=rollout.max_num_seqs=8

`--bare` adds the floor as one more arm, alternated with the others: `benchmarks/bare_loop.py`,
the same recipe's work as a plain torch loop (only `tiny_sd3_flowgrpo`'s is written), and the
summary then gives every arm's phase times as ratios to it.

The summary gives each arm's median step time per thread count (median over rounds of the
per-run medians), its ratio to the first arm, and whether each arm's reward sequence equals the
first arm's at the same thread count. Writes JSON (atomically) to --out and prints a table.
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
from datetime import datetime, timezone
from pathlib import Path

from omni_rl.utils.atomic import atomic_write_json

ROOT = Path(__file__).resolve().parent.parent

PHASES = ("rollout", "reward", "old_log_prob", "update", "weight_sync", "step")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="tiny_sd3_flowgrpo")
    p.add_argument("--arm", action="append", default=[], help="NAME=PATH of a checkout (repeatable; default this=.)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run not counted")
    p.add_argument("--rounds", type=int, default=1, help="runs per (arm, threads), alternated")
    p.add_argument("--override", action="append", default=[], help="extra key=value for every run")
    p.add_argument("--arm-override", action="append", default=[],
                   help="NAME=key=value: an extra override for one arm (two arms may share a checkout)")
    p.add_argument("--bare", action="store_true", help="add the plain torch loop (benchmarks/bare_loop.py) as arm 'bare'")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "step_breakdown.json"))
    args = p.parse_args(argv)
    if args.steps <= args.warmup:
        p.error(f"--steps={args.steps} must exceed --warmup={args.warmup}")
    arms = {}
    for spec in args.arm or ["this=."]:
        name, sep, path = spec.partition("=")
        if not sep or not name or not (Path(path) / "main_omni.py").is_file():
            p.error(f"--arm {spec!r}: expected NAME=PATH of a checkout with main_omni.py")
        arms[name] = Path(path).resolve()
    if args.bare:
        if "bare" in arms:
            p.error("--bare adds an arm named 'bare'; name the other arms differently")
        other = [item for item in args.override if not item.startswith("reward.")]
        if other:
            p.error(f"--override {other[0]!r} with --bare: the bare loop takes only reward.* overrides (its other "
                    f"work is the recipe's as written); pass it with --arm-override to the arms it is for")
        arms["bare"] = ROOT
    args.arms = arms
    args.arm_overrides = {name: [] for name in arms if name != "bare" or not args.bare}
    for spec in args.arm_override:
        name, sep, override = spec.partition("=")
        if not sep or name not in arms or "=" not in override:
            p.error(f"--arm-override {spec!r}: expected NAME=key=value for one of the arms {sorted(arms)}")
        args.arm_overrides[name].append(override)
    return args


def commit_of(path: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path, capture_output=True, text=True)
    return out.stdout.strip() or "?"


def run_once(args, path: Path, threads: int, out: Path, extra: list[str], bare: bool = False) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if bare:
        cmd = [sys.executable, "benchmarks/bare_loop.py", f"--recipe={args.recipe}", f"--steps={args.steps}", f"--out={out}",
               *(f"--override={item}" for item in args.override)]
        env["PYTHONPATH"] = str(path)
    else:
        cmd = [
        sys.executable, "main_omni.py", f"recipe={args.recipe}", f"trainer.total_steps={args.steps}",
        "trainer.val_every=0", "trainer.save_every=0", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]",
        f"trainer.output_dir={out}", *args.override, *extra,
        ]
    proc = subprocess.run(cmd, cwd=path, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    if proc.returncode != 0:
        raise SystemExit(f"run failed in {path} (exit {proc.returncode}): {proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "timing/step" in r]
    counted = records[args.warmup :]
    medians = {
        p: statistics.median(r[f"timing/{p}"] for r in counted) for p in PHASES if f"timing/{p}" in counted[0]
    }
    return {"median_s": medians, "rewards": [r["reward/total/mean"] for r in records]}


def summarize(args, runs: list[dict]) -> dict:
    first = next(iter(args.arms))
    out: dict = {}
    for name in args.arms:
        for threads in args.threads:
            mine = [r for r in runs if r["arm"] == name and r["threads"] == threads]
            ref = [r for r in runs if r["arm"] == first and r["threads"] == threads]
            step = statistics.median(r["median_s"]["step"] for r in mine)
            ref_step = statistics.median(r["median_s"]["step"] for r in ref)
            out.setdefault(name, {})[str(threads)] = {
                "median_step_s": step,
                "phases_s": {p: statistics.median(r["median_s"][p] for r in mine) for p in mine[0]["median_s"]},
                f"step_ratio_to_{first}": step / ref_step,
                f"rewards_equal_{first}": all(r["rewards"] == ref[0]["rewards"] for r in mine),
            }
            bare = [r for r in runs if r["arm"] == "bare" and r["threads"] == threads] if args.bare else []
            if bare and name != "bare":
                floor = {p: statistics.median(r["median_s"][p] for r in bare) for p in bare[0]["median_s"]}
                out[name][str(threads)]["ratio_to_bare"] = {
                    p: out[name][str(threads)]["phases_s"][p] / floor[p] for p in floor
                    if p in out[name][str(threads)]["phases_s"] and floor[p] > 0}
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="omni_rl_steps_") as tmp:
        for rnd in range(args.rounds):
            for threads in args.threads:
                for name, path in args.arms.items():
                    bare = args.bare and name == "bare"
                    res = run_once(args, path, threads, Path(tmp) / f"{name}_{threads}_{rnd}",
                                   args.arm_overrides.get(name, []), bare=bare)
                    runs.append({"arm": name, "threads": threads, "round": rnd, **res})
                    print(f"round {rnd} {name:>8} threads={threads}: step {res['median_s']['step']:.3f} s "
                          + " ".join(f"{p}={v:.3f}" for p, v in res["median_s"].items() if p != "step"), flush=True)
    result = {
        "benchmark": "step_breakdown",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "recipe": args.recipe, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
        "overrides": args.override,
        "arms": {name: {"commit": commit_of(path), "overrides": args.arm_overrides.get(name, [])}
                 for name, path in args.arms.items()},
        "summary": summarize(args, runs),
        "runs": runs,
    }
    atomic_write_json(Path(args.out), result)
    for name, per in result["summary"].items():
        for threads, s in per.items():
            print(f"{name:>8} threads={threads}: median step {s['median_step_s']:.3f} s; "
                  + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items()
                              if k.startswith(("step_ratio", "rewards_equal"))))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Does the compiled demo learn as the eager one does? Reward rise and log-prob gap over seeds.

Each run is the demo recipe (`python main_omni.py`, `tiny_sd3_shapes_counting`) for its whole
`trainer.total_steps` in a fresh process at `--threads` torch threads (one by default), no
validation, no checkpoint, the old log-probs checked against the trainer's on every step
(`algo.logprob_check_every=1`) in both arms. The arms, alternated seed by seed so that the
machine's drifting load falls on both alike:

- `eager`: the recipe as it is;
- `compiled`: `model.compile_options.enabled=true`, from an inductor cache that one warm-up run
  filled first (its compile time is recorded; the learning runs then pay only the cached cost).

From each run's metrics.jsonl: the training reward (`reward/total/mean`) per step, its rise (the
mean of the last `--window` steps less the mean of the first `--window`), and the largest
log-prob gap between the rollout's and the trainer's log-probs (`rollout_corr/logprob_abs_diff_max`)
and first-mini-batch ratio deviation (`actor/first_minibatch_ratio_max_abs_dev`) over the run.
"Learns as eager does" is judged as the issue says: the compiled rises' mean lies within the
eager seeds' spread (their range) of the eager mean, and the gap stays at most 1e-5. The JSON is
rewritten after every run, so a run cut short keeps what finished.

    python benchmarks/compile_learning.py --seeds 0 1 2

Not here: validation accuracy (the demo's held-out measure, docs/demo.md), which costs five
rollouts per validation and is the same function of the weights in both arms.
"""
from __future__ import annotations

import argparse
import json
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

GAP_KEY = "rollout_corr/logprob_abs_diff_max"
RATIO_KEY = "actor/first_minibatch_ratio_max_abs_dev"
GAP_BOUND = 1e-5  # issue 44, "What must hold"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="tiny_sd3_shapes_counting")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="trainer.total_steps (default: the recipe's)")
    p.add_argument("--window", type=int, default=5, help="steps averaged at each end for the rise")
    p.add_argument("--cache-dir", default=None, help="inductor cache (default: a fresh temporary one); one that "
                   "holds files already is taken as filled and the warm-up run is skipped")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="start nothing: join the runs of these results files into one summary at --out")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "compile_learning.json"))
    return p.parse_args(argv)


def run_once(args, arm: str, seed: int, out: Path, cache: Path) -> dict:
    overrides = [f"recipe={args.recipe}", f"trainer.seed={seed}", "algo.logprob_check_every=1"]
    if args.steps:
        overrides.append(f"trainer.total_steps={args.steps}")
    if arm != "eager":
        overrides += ["model.compile_options.enabled=true", f"model.compile_options.cache_dir={cache}"]
    run = timed_run(overrides, out, arm_env(OMP_NUM_THREADS=str(args.threads)), args.timeout_s, f"{arm} seed {seed}")
    if run.timed_out:
        return {"wall_s": run.wall_s, "timed_out": True, "load_at_start": run.load_at_start}
    rows = [r for r in run.rows if "reward/total/mean" in r]
    rewards = [r["reward/total/mean"] for r in rows]
    gaps = [r[GAP_KEY] for r in rows if r.get(GAP_KEY) is not None]
    ratios = [r[RATIO_KEY] for r in rows if r.get(RATIO_KEY) is not None]
    graphs = [r["perf/compiled_graphs"] for r in rows if r.get("perf/compiled_graphs") is not None]
    w = min(args.window, len(rewards) // 2) or 1
    return {"wall_s": run.wall_s, "timed_out": False, "load_at_start": run.load_at_start, "child_cpu_s": run.cpu_s,
            "rewards": rewards, "first_mean": statistics.fmean(rewards[:w]), "last_mean": statistics.fmean(rewards[-w:]),
            "rise": statistics.fmean(rewards[-w:]) - statistics.fmean(rewards[:w]),
            "gap_max": max(gaps) if gaps else None, "ratio_dev_max": max(ratios) if ratios else None,
            "gap_steps": len(gaps), "step_s": [r.get("timing/step") for r in rows],
            "recompiles_after_first_step": (graphs[-1] - graphs[0]) if graphs else None}


def summarize(runs: list[dict]) -> dict:
    out = {}
    for arm in ("eager", "compiled"):
        done = [r for r in runs if r["arm"] == arm and not r["timed_out"]]
        if not done:
            continue
        rises = [r["rise"] for r in done]
        out[arm] = {"seeds": [r["seed"] for r in done], "rises": rises, "rise_mean": statistics.fmean(rises),
                    "rise_range": [min(rises), max(rises)],
                    "rise_std": statistics.stdev(rises) if len(rises) > 1 else None,
                    "gap_max": max((r["gap_max"] for r in done if r["gap_max"] is not None), default=None),
                    "ratio_dev_max": max((r["ratio_dev_max"] for r in done if r["ratio_dev_max"] is not None), default=None),
                    "step_s_median": statistics.median(s for r in done for s in r["step_s"][1:] if s is not None)}
    if "eager" in out and "compiled" in out:
        e, c = out["eager"], out["compiled"]
        lo, hi = e["rise_range"]
        spread = hi - lo
        out["compiled_minus_eager_rise"] = c["rise_mean"] - e["rise_mean"]
        out["eager_spread"] = spread
        out["same_rise_within_spread"] = abs(c["rise_mean"] - e["rise_mean"]) <= spread
        out["gap_within_bound"] = c["gap_max"] is not None and c["gap_max"] <= GAP_BOUND
        paired = {r["seed"]: r["rise"] for r in runs if r["arm"] == "eager" and not r["timed_out"]}
        out["paired_rise_delta"] = {str(r["seed"]): r["rise"] - paired[r["seed"]]
                                    for r in runs if r["arm"] == "compiled" and not r["timed_out"] and r["seed"] in paired}
    return out


def merge(args) -> None:
    files = [json.loads(Path(f).read_text()) for f in args.merge]
    for f, body in zip(args.merge, files):
        if body.get("benchmark") != "compile_learning" or body["recipe"] != files[0]["recipe"] or body["threads"] != files[0]["threads"]:
            raise SystemExit(f"{f}: not a compile_learning result of recipe {files[0]['recipe']!r} at "
                             f"{files[0]['threads']} threads; merge only runs of one recipe and thread count")
    runs = [r for body in files for r in body["runs"]]
    seeds = [(r["arm"], r["seed"]) for r in runs]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"{args.merge}: a seed's arm appears twice; merge files of different seeds")
    result = {**files[0], "seeds": sorted({r["seed"] for r in runs}), "runs": runs, "summary": summarize(runs),
              "merged_from": [{"command": b["command"], "date": b["date"]} for b in files],
              "command": "python benchmarks/compile_learning.py --merge " + " ".join(args.merge)}
    atomic_write_json(Path(args.out), result)
    print(json.dumps(result["summary"], indent=1))


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.merge:
        merge(args)
        return
    result = {"benchmark": "compile_learning", "recipe": args.recipe, "threads": args.threads, "seeds": args.seeds,
              "window": args.window, "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": "python benchmarks/compile_learning.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "runs": []}
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="compile_learning_") as tmp:
        cache = Path(args.cache_dir) if args.cache_dir else Path(tmp) / "inductor"
        # Fill the cache once: the learning runs compare steady compiled steps with eager ones.
        if not (cache.is_dir() and any(cache.iterdir())):
            warm = run_once(argparse.Namespace(**{**vars(args), "steps": 1}), "compiled", args.seeds[0], Path(tmp) / "warm", cache)
            result["warmup_compile_run_s"] = warm["wall_s"]
            print(f"warm-up compile run {warm['wall_s']:.0f} s (load {warm['load_at_start']:.1f})", flush=True)
        for seed in args.seeds:
            for arm in ("eager", "compiled"):
                r = run_once(args, arm, seed, Path(tmp) / f"{arm}_{seed}", cache)
                result["runs"].append({"arm": arm, "seed": seed, **r})
                result["summary"] = summarize(result["runs"])
                result["load_average_at_end"] = os.getloadavg()[0]
                atomic_write_json(out, result)
                print(f"seed {seed} {arm:8s} wall {r['wall_s']:6.0f} s  rise {r.get('rise', float('nan')):+.3f}  "
                      f"gap max {r.get('gap_max')}  ratio dev max {r.get('ratio_dev_max')}  load {r['load_at_start']:.1f}",
                      flush=True)
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()

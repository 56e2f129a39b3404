"""Joint vs image-alone: does training the prompt writer with the shape model raise the reward more?

Issue 41's "Joint, tiny": `recipes/tiny_write_draw.yaml` (a tiny Qwen3 writes the shape model's
prompt, both trained) against the same recipe with the writer frozen (`model.adapter_options.writer.trained=
false`: the shape model trained alone, reading the same untrained writer's text), the same steps,
seeds and sizes. A third arm, `writer` (`model.adapter_options.train_image=false`: the shape model frozen),
measures "Draw, tiny". Each run is `python main_omni.py` in a subprocess with `trainer.seed=SEED`,
in a fresh folder; `--jobs` runs at a time, in the order seed by seed, so a drifting machine load slows the
arms alike.

Per run: `reward` the per-step mean total reward, and `rise` omni_rl.logging.rise_report on it
(the mean of the last `--frac` of the steps minus that of the first, `z` in pooled standard errors).
Per arm: each seed's rise and z, their mean; `joint_minus_image` the difference of the rises per seed
and `joint_beats_image_on` the seeds where joint rose more.

    python benchmarks/joint_write_draw.py                                  # 3 seeds x joint, image; 30 steps
    python benchmarks/joint_write_draw.py --arms writer --seeds 0 --steps 40

Writes JSON (atomically) to --out and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from omni_rl.logging import rise_report  # noqa: E402
from omni_rl.utils.atomic import atomic_write_json  # noqa: E402

RECIPE = "tiny_write_draw"
# The overrides of each arm on top of the recipe.
ARMS = {
    "joint": [],
    "image": ["model.adapter_options.writer.trained=false"],
    "writer": ["model.adapter_options.train_image=false"],
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", nargs="+", default=["joint", "image"], choices=sorted(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--frac", type=float, default=0.2, help="the first and last windows' share of the steps")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each run (OMP_NUM_THREADS)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each in its own process)")
    p.add_argument("--override", action="append", default=[], help="extra key=value for every run")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "joint_write_draw.json"))
    return p.parse_args(argv)


def run(args, arm: str, seed: int, folder: Path) -> dict:
    command = [
        sys.executable, "main_omni.py", f"recipe={RECIPE}", f"trainer.output_dir={folder}", f"trainer.seed={seed}",
        f"trainer.total_steps={args.steps}", "trainer.val_every=0", "trainer.save_every=0",
        "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", *ARMS[arm], *args.override,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OMP_WAIT_POLICY": "PASSIVE"}
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{arm} seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = folder / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in records if "reward/total/mean" in r]
    rise = rise_report(metrics, frac=args.frac)
    return {
        "arm": arm, "seed": seed, "overrides": ARMS[arm] + args.override, "wall_s": round(wall, 1),
        "reward": [r["reward/total/mean"] for r in steps],
        "writer_length": [r.get("response/plan_length_mean") for r in steps],
        "rise": rise["last_mean"] - rise["first_mean"], "z": rise["z"],
        "first_mean": rise["first_mean"], "last_mean": rise["last_mean"],
    }


def summary(runs: list[dict], arms: list[str], seeds: list[int]) -> dict:
    by = {(r["arm"], r["seed"]): r for r in runs}
    out = {}
    for arm in arms:
        rises = [by[arm, s]["rise"] for s in seeds]
        out[arm] = {"rise_per_seed": dict(zip(map(str, seeds), rises)),
                    "z_per_seed": dict(zip(map(str, seeds), [by[arm, s]["z"] for s in seeds])),
                    "rise_mean": sum(rises) / len(rises)}
    if "joint" in arms and "image" in arms:
        diffs = {str(s): by["joint", s]["rise"] - by["image", s]["rise"] for s in seeds}
        out["joint_minus_image"] = diffs
        out["joint_beats_image_on"] = [s for s, d in diffs.items() if d > 0]
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    runs = []
    todo = [(arm, seed) for seed in args.seeds for arm in args.arms]
    with tempfile.TemporaryDirectory(prefix="joint_write_draw_") as scratch, \
            ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run, args, arm, seed, Path(scratch) / f"{arm}_{seed}") for arm, seed in todo]
        for future in futures:
            result = future.result()
            runs.append(result)
            print(f"{result['arm']:>6} seed {result['seed']}: reward {result['first_mean']:.3f} -> "
                  f"{result['last_mean']:.3f} (rise {result['rise']:+.3f}, z = {result['z']:.1f}), "
                  f"{result['wall_s']:.0f} s", flush=True)
    out = {
        "benchmark": "joint_write_draw", "recipe": RECIPE, "steps": args.steps, "seeds": args.seeds, "frac": args.frac,
        "arms": {arm: ARMS[arm] for arm in args.arms}, "overrides": args.override,
        "command": "python benchmarks/joint_write_draw.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": args.threads},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "summary": summary(runs, args.arms, args.seeds), "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(args.out), out)
    print(json.dumps(out["summary"], indent=1))
    return out


if __name__ == "__main__":
    main()

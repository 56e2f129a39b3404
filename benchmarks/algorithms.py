"""Every diffusion RL algorithm on the GenEval shape testbed: same start, same budget, 3 seeds.

Each algorithm trains a recipe of the shape model (`--recipe`; by default the demo's,
`tiny_sd3_shapes_counting`: LoRA on the pretrained `tiny:sd3_shapes`, the `geneval_shapes`
reward; `tiny_sd3_shapes_geneval` is the whole task with held-out captions) with its own
overrides (`ALGORITHMS`), for `--steps` steps of `prompts_per_step x samples_per_prompt` samples
each (the same sample budget for all), once per seed, as `python main_omni.py` in a subprocess.
Validation runs every `--val-every` steps on the recipe's validation captions (ODE, fixed seeds,
the same images for the same weights, scored by success), and its per-sample records
(`samples/val_step_*.jsonl`) give the accuracy at each point; the trainer's `timing/step` gives
the wall time spent training up to it.

    python benchmarks/algorithms.py                                 # all, 3 seeds, 30 steps
    python benchmarks/algorithms.py --algorithms flow_grpo flow_dppo --seeds 0 --steps 10
    python benchmarks/algorithms.py --seeds 1 2 --merge seed0.json  # seed 0's runs from an earlier file
    python benchmarks/algorithms.py --seeds --merge a.json b.json   # no new run: combine two files

`--merge` takes the runs of earlier result files of the same benchmark (recipe, steps, validation
points and each algorithm's overrides must agree, and a seed may come from one place only), so
the seeds of a long comparison can be run in separate sittings and summarised together.

Writes `--out` (JSON, atomically) and a PNG beside it: validation accuracy against step and against
training wall time, one line per algorithm (the mean over seeds, error bars one standard error
across seeds). Per algorithm the JSON has each seed's curve, the final accuracy (mean, se over
seeds), the paired z of its rise (`omni_rl.logging.val_rise`, per seed), per-task final accuracy,
the median step time, and `failed` with the error's last lines if a run did not finish.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from omni_rl.logging import read_jsonl, read_val_records, val_rise  # noqa: E402
from omni_rl.logging.val_records import val_record_files  # noqa: E402
from omni_rl.utils.atomic import atomic_save_image, atomic_write_json  # noqa: E402

RECIPE = "tiny_sd3_shapes_counting"
WHOLE_SCHEDULE = ["rollout.sampling_options.sde_window_size=0", "rollout.sampling_options.sde_window_range=null"]
# name -> overrides of the recipe (which is FlowGRPO with a fixed 3-step SDE window).
ALGORITHMS: dict[str, list[str]] = {
    "flow_grpo": WHOLE_SCHEDULE,  # Flow-GRPO as published: every step stochastic and trained
    "flow_grpo_window": [],  # Flow-GRPO-Fast style: a 3-step window per sample
    "dance_grpo": WHOLE_SCHEDULE + ["rollout.sampling_options.kernel=dance_sde", "rollout.sampling_options.noise_level=0.3",
                                    "algo.family_options.same_noise_in_group=true", "algo.family_options.timestep_fraction=0.6"],
    "mix_grpo": ["rollout.sampling_options.sde_window_schedule=progressive"],  # sde_window_options.tau set from --steps
    "flow_dppo": ["algo.policy_loss=flow_dppo"],
    "grpo_guard": ["algo.policy_loss=grpo_guard"],
    # The forward-process losses train on the same (SDE-window) rollouts' clean latents; they read
    # no log-probs, so the rollout-vs-trainer log-prob check is off.
    "diffusion_nft": ["algo.policy_loss=diffusion_nft", "algo.logprob_check_every=0"],
    "diffusion_dpo": ["algo.policy_loss=diffusion_dpo", "algo.policy_loss_options.diffusion_dpo.beta=500", "algo.advantage_options.std_mode=group",
                      "algo.logprob_check_every=0"],
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    p.add_argument("--merge", nargs="+", default=[], help="earlier results files whose runs join this one's")
    p.add_argument("--recipe", default=RECIPE)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--val-every", type=int, default=15)
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: torch's)")
    p.add_argument("--override", action="append", default=[], help="extra key=value for every run")
    p.add_argument("--work-dir", default=str(REPO / "outputs" / "algorithms"), help="the runs' output folders")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "algorithms.json"))
    return p.parse_args(argv)


def overrides_of(name: str, args) -> list[str]:
    extra = list(ALGORITHMS[name])
    if name == "mix_grpo":  # slide the window over [0, 8) once in the run: 6 positions
        extra.append(f"rollout.sampling_options.sde_window_options.tau={max(1, args.steps // 6)}")
    return extra


def earlier_runs(files: list[str], args) -> dict[str, list[dict]]:
    """The runs of earlier results files, per algorithm of this benchmark; raises `ValueError`
    naming the file and the setting when one is of another benchmark or repeats a seed."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for file in files:
        record = json.loads(Path(file).read_text(encoding="utf-8"))
        for key in ("recipe", "steps", "val_every"):
            if record.get(key) != getattr(args, key):
                raise ValueError(f"{file}: {key}={record.get(key)!r} but this run's is {getattr(args, key)!r}; "
                                 f"merge only results of the same benchmark")
        if record["overrides"].get("all", []) != args.override:
            raise ValueError(f"{file}: every run had the overrides {record['overrides'].get('all', [])} but this "
                             f"run's are {args.override}; merge only results of the same settings")
        for name in args.algorithms:
            if name not in record["results"]:
                continue
            if record["overrides"].get(name) != overrides_of(name, args):
                raise ValueError(f"{file}: {name} ran with {record['overrides'].get(name)} but this run's overrides "
                                 f"are {overrides_of(name, args)}; merge only results of the same settings")
            runs[name].extend(record["results"][name]["runs"])
    for name, found in runs.items():
        seeds = [r["seed"] for r in found] + list(args.seeds)
        repeated = sorted({s for s in seeds if seeds.count(s) > 1})
        if repeated:
            raise ValueError(f"{name}: seed(s) {repeated} come from more than one place (--merge files, --seeds); "
                             f"leave them out of --seeds")
    return runs


def run_one(name: str, seed: int, args) -> dict:
    folder = Path(args.work_dir) / f"{name}_seed{seed}"
    cmd = [sys.executable, str(REPO / "main_omni.py"), f"recipe={args.recipe}", *overrides_of(name, args),
           f"trainer.seed={seed}", f"trainer.total_steps={args.steps}", f"trainer.val_every={args.val_every}",
           f"trainer.save_every={args.steps}", f"trainer.output_dir={folder}", "trainer.overwrite=true",
           "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", *args.override]
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        return {"seed": seed, "failed": f"exit {proc.returncode}: {proc.stderr.strip()[-1500:]}", "wall_s": round(wall, 1)}
    return {"seed": seed, "wall_s": round(wall, 1), **read_run(folder)}


def read_run(folder: Path) -> dict:
    """The validation accuracy at each validation, with the training wall time up to it."""
    rows = read_jsonl(folder / "metrics.jsonl")
    step_s = {int(r["step"]): r["timing/step"] for r in rows if r.get("timing/step") is not None}
    curve = []
    for file in val_record_files(folder):
        step = int(file.stem.rsplit("_", 1)[1])
        records = read_val_records(file)
        by_task: dict[str, list[float]] = defaultdict(list)
        for rec in records:
            by_task[rec["groups"].get("geneval_shapes", "all")].append(rec["reward"])
        curve.append({
            "step": step, "train_s": round(sum(v for s, v in step_s.items() if s <= step), 2),
            "accuracy": statistics.fmean(r["reward"] for r in records), "n": len(records),
            "per_task": {task: statistics.fmean(v) for task, v in sorted(by_task.items())},
        })
    rise = val_rise(folder)
    return {"curve": curve, "rise_z": rise["z"], "rise": rise["rise"],
            "step_s_median": statistics.median(step_s.values()) if step_s else None}


def summarise(runs: list[dict]) -> dict:
    done = [r for r in runs if "failed" not in r]
    if not done:
        return {"runs": runs, "failed": runs[0]["failed"]}
    finals = [r["curve"][-1]["accuracy"] for r in done]
    starts = [r["curve"][0]["accuracy"] for r in done]
    tasks = sorted(done[0]["curve"][-1]["per_task"])
    return {
        "runs": runs,
        "start_accuracy": statistics.fmean(starts),
        "final_accuracy": {"mean": statistics.fmean(finals), "se": _se(finals), "seeds": len(finals)},
        "final_per_task": {t: statistics.fmean(r["curve"][-1]["per_task"][t] for r in done) for t in tasks},
        "rise_z": [r["rise_z"] for r in done],
        "step_s_median": statistics.median(r["step_s_median"] for r in done if r["step_s_median"] is not None),
        "train_s": statistics.fmean(r["curve"][-1]["train_s"] for r in done),
        **({"failed": [r["failed"] for r in runs if "failed" in r]} if len(done) < len(runs) else {}),
    }


def _se(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


def plot(results: dict, out_png: Path) -> None:
    """Accuracy against step and against training time, mean over seeds with 1-se bars."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    fig = Figure(figsize=(12, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    by_step, by_time = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for name, summary in results.items():
        done = [r for r in summary["runs"] if "failed" not in r]
        if not done:
            continue
        points = len(min((r["curve"] for r in done), key=len))
        steps = [done[0]["curve"][k]["step"] for k in range(points)]
        acc = [[r["curve"][k]["accuracy"] for r in done] for k in range(points)]
        secs = [statistics.fmean(r["curve"][k]["train_s"] for r in done) for k in range(points)]
        mean, err = [statistics.fmean(a) for a in acc], [_se(a) for a in acc]
        by_step.errorbar(steps, mean, yerr=err, marker="o", capsize=3, label=name)
        by_time.errorbar(secs, mean, yerr=err, marker="o", capsize=3, label=name)
    by_step.set(xlabel="training step", ylabel="GenEval accuracy (validation)", title="accuracy vs step")
    by_time.set(xlabel="training wall time (s)", title="accuracy vs wall time")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=8)
    fig.tight_layout()
    fig.canvas.draw()
    image = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba()).convert("RGB")
    atomic_save_image(image, out_png)


def main(argv=None) -> int:
    args = parse_args(argv)
    earlier = earlier_runs(args.merge, args)
    results = {}
    for name in args.algorithms:
        runs = list(earlier.get(name, []))
        if not runs and not args.seeds:
            continue
        for seed in args.seeds:
            run = run_one(name, seed, args)
            runs.append(run)
            final = run["curve"][-1]["accuracy"] if "curve" in run else float("nan")
            print(f"{name} seed {seed}: {'FAILED ' + run['failed'][-200:] if 'failed' in run else f'accuracy {final:.3f}'}"
                  f" ({run['wall_s']} s)", flush=True)
        results[name] = summarise(sorted(runs, key=lambda r: r["seed"]))
    out = Path(args.out)
    record = {
        "benchmark": "algorithms", "recipe": args.recipe, "steps": args.steps, "val_every": args.val_every,
        "seeds": sorted({r["seed"] for s in results.values() for r in s["runs"]}),
        "merged_from": [Path(f).name for f in args.merge],
        "overrides": {n: overrides_of(n, args) for n in results} | {"all": args.override},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "results": results,
    }
    atomic_write_json(out, record)
    plot(results, out.with_suffix(".png"))
    print(f"{'algorithm':18} {'start':>6} {'final':>13} {'z (per seed)':>20} {'step s':>7}")
    for name, s in results.items():
        if "final_accuracy" not in s:
            print(f"{name:18} failed: {str(s['failed'])[-120:]}")
            continue
        f = s["final_accuracy"]
        zs = " ".join(f"{z:.1f}" for z in s["rise_z"])
        print(f"{name:18} {s['start_accuracy']:6.3f} {f['mean']:6.3f} ± {f['se']:.3f} {zs:>20} {s['step_s_median']:7.2f}")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

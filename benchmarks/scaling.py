"""Step time and samples/s of a tiny recipe on 1 and 2 Ray workers (and in one process).

Each arm trains the same recipe (default: `tiny_qwen3_grpo`, full fine-tuning, micro-batches of
8, 8 new tokens) for `--steps` steps in a fresh output folder: `local` is one process
(`trainer.backend=local`); `ray_N` is N hybrid workers on a local Ray (`trainer.backend=ray
trainer.engine=fsdp2 trainer.backend_options.devices_per_node=N`, FSDP2 over gloo on a CPU). The first
`--warmup` steps of each arm are not counted; the numbers are medians over the rest of the
trainer's own `timing/step` (rollout + reward + old log-probs + update + weight sync; not the
checkpoint save) and `perf/samples_per_s` (samples of the global batch / step time).

    python benchmarks/scaling.py                          # local, 1 and 2 workers, 6 steps each
    python benchmarks/scaling.py --workers 1 2 4 --steps 10 --out /tmp/scaling.json

The global batch is the same in every arm (prompts_per_step * samples_per_prompt), so on a
machine with at least N free cores samples/s should rise with N; on a 2-core machine the driver
and the workers share the cores and the gloo collectives cost more than the tiny model's
compute, so expect little or no gain there: the script measures, it does not promise.

Writes JSON (atomically) to --out and prints a short table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from omni_rl.utils.atomic import atomic_write_json
from omni_rl.workers.ray_cluster import init_local_ray


def repo_relative(path: str) -> str:
    """`path` relative to the repository root when it lies inside it, else as given."""
    root = Path(__file__).resolve().parent.parent
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="tiny_qwen3_grpo")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Ray worker counts to measure")
    p.add_argument("--no-local", action="store_true", help="skip the one-process arm")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1, help="first steps of each arm not counted")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--override", action="append", default=[], help="extra key=value for every arm")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "scaling.json"))
    args = p.parse_args(argv)
    if args.steps <= args.warmup:
        p.error(f"--steps={args.steps} must exceed --warmup={args.warmup}")
    return args


def run_arm(args, name: str, extra: list[str], root: Path) -> dict:
    from omni_rl.compose import load_config
    from omni_rl.trainer import PPOTrainer

    out = root / name
    overrides = [
        f"recipe={args.recipe}", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", "trainer.val_every=0",
        "trainer.save_every=0", f"trainer.total_steps={args.steps}", f"trainer.micro_batch_size={args.micro_batch_size}",
        f"rollout.sampling_options.max_new_tokens={args.max_new_tokens}", f"trainer.output_dir={out}", *args.override, *extra,
    ]
    t0 = time.perf_counter()
    cfg = load_config(overrides)
    PPOTrainer(cfg).fit()
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][args.warmup:]
    step_s = [r["timing/step"] for r in records]
    return {
        "step_s": statistics.median(step_s),
        "samples_per_s": statistics.median(r["perf/samples_per_s"] for r in records),
        "update_s": statistics.median(r["timing/update"] for r in records),
        "rollout_s": statistics.median(r["timing/rollout"] for r in records),
        "samples_per_step": cfg.trainer.prompts_per_step * cfg.trainer.samples_per_prompt,
        "timed_steps": len(records),
        "step_s_all": step_s,
        "run_wall_s": wall,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    import ray

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="scaling_") as tmp:
        root = Path(tmp)
        if not args.no_local:
            results["local"] = run_arm(args, "local", [], root)
        temp = tempfile.mkdtemp(prefix="ray_")
        init_local_ray(max(max(args.workers), os.cpu_count() or 1), _temp_dir=temp, log_to_driver=False)
        try:
            for n in args.workers:
                results[f"ray_{n}"] = run_arm(
                    args, f"ray_{n}",
                    ["trainer.backend=ray", "trainer.engine=fsdp2", f"trainer.backend_options.devices_per_node={n}"], root,
                )
        finally:
            ray.shutdown()
    report = {
        "results": results,
        "machine": {
            "cpus": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "torch": torch.__version__, "ray": ray.__version__, "python": platform.python_version(),
            "load_avg_1min": os.getloadavg()[0],
        },
        # The output path as the repository names it (no machine's absolute path in the result).
        "settings": {**vars(args), "out": repo_relative(args.out)},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    atomic_write_json(Path(args.out), report)
    print(f"{'arm':10s} {'step s':>8s} {'samples/s':>10s} {'update s':>9s} {'rollout s':>10s}")
    for name, r in results.items():
        print(f"{name:10s} {r['step_s']:8.3f} {r['samples_per_s']:10.1f} {r['update_s']:9.3f} {r['rollout_s']:10.3f}")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

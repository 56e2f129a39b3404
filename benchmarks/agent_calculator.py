"""The "Tools, tiny" measurement of issue 41: does a tiny Qwen3 learn to call the calculator?

Runs `recipes/tiny_qwen3_calculator_agent.yaml` (or the recipe and overrides given) in a child
process and reads its metrics.jsonl: validation accuracy (the plain `arithmetic_answer`, 64
products x `trainer.val_samples_per_prompt` trajectories, fixed seeds) and the validation
tool-call rate before training (step 0) and at the end. The rise in accuracy is in standard
errors of the difference of two proportions, sqrt(p0(1-p0)/n + p1(1-p1)/n). Writes JSON with
the command, the wall-clock and CPU seconds of the run (the child's user + system time; the
cold start that builds tiny:qwen3_calculator on first use is timed apart when it runs here).

    python benchmarks/agent_calculator.py --out benchmarks/results/agent_calculator.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    subprocess.run(command, cwd=ROOT, check=True)
    return time.perf_counter() - wall, cpu_seconds() - cpu


def val_row(records: list[dict], step: int) -> dict:
    rows = [r for r in records if r.get("step") == step and any(k.startswith("val/") for k in r)]
    if not rows:
        raise SystemExit(f"no validation record at step {step} in the run's metrics.jsonl")
    merged: dict = {}
    for r in rows:
        merged.update(r)
    return merged


def accuracy_key(row: dict) -> str:
    keys = [k for k in row if k.startswith("val/") and "arithmetic_answer" in k and k.endswith("mean")]
    keys = keys or [k for k in row if k.startswith("val/") and "arithmetic_answer" in k]
    if not keys:
        raise SystemExit(f"no val/*arithmetic_answer* metric; the validation keys are {sorted(k for k in row if k.startswith('val/'))}")
    return sorted(keys, key=len)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="tiny_qwen3_calculator_agent")
    parser.add_argument("--out", default="benchmarks/results/agent_calculator.json")
    parser.add_argument("--output-dir", default="outputs/bench_agent_calculator")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)

    build = [sys.executable, "-c", "import agent_tools; from omni_rl.models.loading import build_tiny_model; "
                                   "build_tiny_model('qwen3_calculator')"]
    build_wall, build_cpu = timed(build)
    run = [sys.executable, "main_omni.py", f"recipe={args.recipe}", f"trainer.output_dir={args.output_dir}",
           "trainer.loggers=[console,jsonl]", *args.overrides]
    wall, cpu = timed(run)
    records = [json.loads(line) for line in (ROOT / args.output_dir / "metrics.jsonl").read_text().splitlines() if line]
    last = max(r.get("step", 0) for r in records)
    before, after = val_row(records, 0), val_row(records, last)
    key = accuracy_key(before)
    n = 64 * int(next((o.split("=")[1] for o in args.overrides if o.startswith("trainer.val_samples_per_prompt=")), 2))
    p0, p1 = before[key], after[key]
    se = math.sqrt(max(p0 * (1 - p0), 1e-12) / n + max(p1 * (1 - p1), 1e-12) / n)
    result = {
        "command": " ".join(["python", "main_omni.py", *run[2:]]),
        "steps": last, "val_trajectories": n,
        "accuracy_before": p0, "accuracy_after": p1, "accuracy_rise_in_se": (p1 - p0) / se,
        "tool_call_rate_before": before.get("val/agent/tool_call_rate"),
        "tool_call_rate_after": after.get("val/agent/tool_call_rate"),
        "train_tool_call_rate": [(r["step"], r["agent/tool_call_rate"]) for r in records if "agent/tool_call_rate" in r],
        "run_wall_s": round(wall, 1), "run_cpu_s": round(cpu, 1),
        "cold_start_wall_s": round(build_wall, 1), "cold_start_cpu_s": round(build_cpu, 1),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpu_count": os.cpu_count(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One command that accepts a GPU machine: `python benchmarks/gpu_acceptance.py`.

On one CUDA GPU it runs, each part in a process of its own and each with its own time limit:

1. `gpu_tests`: the `gpu`-marked tests (`pytest -m gpu`, on the GPU), among them the tiny SD3
   compiled (`model.compile_options`) with inductor's kernels and with CUDA graphs
   (`mode=reduce-overhead`): ratio 1, no recompile after the first step;
2. `rollout_batching`: native against `vllm_omni` at max_num_seqs 1, 8 and 32 on the tiny SD3,
   the tiny Qwen-Image and the tiny FLUX.1 (`benchmarks/rollout_batching.py --backend vllm_omni`:
   samples/s of each and the largest |final latent| difference);
3. `recipes`: 5 steps of every tiny recipe in bf16, with the rollout-vs-trainer log-prob gap
   (`rollout_corr/logprob_abs_diff_mean`/`_max` of step 1) and the first mini-batch's ratio
   (`actor/first_minibatch_ratio_max_abs_dev`, max over the steps);
4. `sleep_wake`: the vllm_omni engine on the tiny SD3 put to sleep and woken, with the memory
   `torch.cuda.mem_get_info` saw it free and whether it samples as before;
5. `memory_plan`: the planner's estimate against `max_memory_allocated`: there is no planner in
   this tree yet (`--plan`), so the part is reported as skipped, with that reason.

It prints one table and writes one JSON (atomically; default
benchmarks/results/gpu_acceptance.json) with the machine, driver, torch and package versions and
every part's status (`pass`, `fail`, `skipped` with its reason), figures and seconds. The exit
code is 1 when a part failed.

`--dry-run` runs the same script on the CPU in under 3 minutes (CI runs it,
tests/benchmarks/test_gpu_acceptance.py): the gpu tests are collected, not run; the native arm of
the batching benchmark runs small; one step of two tiny recipes in float32; the parts that need
vllm-omni / vllm or CUDA are reported as skipped with the reason.

    python benchmarks/gpu_acceptance.py                       # on the GPU machine
    python benchmarks/gpu_acceptance.py --vllm-python /opt/vllm-omni/bin/python   # the CUDA image
    python benchmarks/gpu_acceptance.py --dry-run             # anywhere

Not measured here: the rollout batching benchmark's "no slower than before" comparison on a CPU,
which needs a quiet machine (benchmarks/rollout_batching.py, both arms in one run).
"""
from __future__ import annotations

import argparse
import importlib.metadata
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
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: this checkout's omni_rl first

from omni_rl.utils.atomic import atomic_write_json  # noqa: E402

PACKAGES = ("omni-rl", "torch", "torchvision", "diffusers", "transformers", "peft", "accelerate", "ray",
            "vllm", "vllm-omni")
BATCHING_MODELS = {"tiny_sd3": ["--model-path", "tiny:sd3"],
                   "tiny_qwen_image": ["--model-path", "tiny:qwen_image", "--adapter", "QwenImagePipeline"],
                   "tiny_flux": ["--model-path", "tiny:flux", "--adapter", "FluxPipeline"]}
DRY_RUN_RECIPES = ("tiny_sd3_flowgrpo", "tiny_qwen3_grpo")
GAP_KEYS = ("rollout_corr/logprob_abs_diff_mean", "rollout_corr/logprob_abs_diff_max")
RATIO_KEY = "actor/first_minibatch_ratio_max_abs_dev"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="run on the CPU, small, skipping what needs CUDA or vllm")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_acceptance.json"))
    p.add_argument("--device", default="cuda", help="the accelerator to accept (cuda, cuda:N)")
    p.add_argument("--vllm-python", default=sys.executable,
                   help="the Python that has vllm and vllm-omni (the CUDA image: /opt/vllm-omni/bin/python)")
    p.add_argument("--recipe-steps", type=int, default=5)
    p.add_argument("--only", nargs="+", default=None,
                   help="run only these parts (gpu_tests rollout_batching recipes sleep_wake memory_plan)")
    return p.parse_args(argv)


# --- how each part runs -------------------------------------------------------------------------
def run(cmd: list[str], timeout_s: float, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout_s)


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def skipped(reason: str, **figures) -> dict:
    return {"status": "skipped", "reason": reason, **figures}


def missing_vllm(python: str) -> str | None:
    """Why `python` cannot run the vLLM backends, or None when it can."""
    code = ("from omni_rl.rollout.vllm_omni.availability import missing_packages; "
            "print(','.join(sorted(set(missing_packages('vllm_omni')) | set(missing_packages('vllm')))))")
    try:
        out = run([python, "-c", code], 120)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{python} cannot run: {err}"
    if out.returncode != 0:
        return f"{python} cannot import omni_rl: {tail(out.stderr, 2)}"
    missing = out.stdout.strip()
    return f"{python} has no {missing} (pip install -e .[gpu] on a CUDA machine)" if missing else None


def gpu_test_files() -> list[str]:
    """The test files that mark tests `gpu` (collecting only them is quicker than the whole tree)."""
    return sorted(str(f.relative_to(ROOT)) for f in (ROOT / "tests").rglob("test_*.py") if "mark.gpu" in f.read_text())


def gpu_tests(args, device: str) -> dict:
    env = {"OMNI_RL_ACCEL_TEST_DEVICE": device}
    files = gpu_test_files()
    if args.dry_run:
        out = run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider",
                   *files], 300, env)
        count = sum(1 for line in out.stdout.splitlines() if "::" in line)
        if out.returncode not in (0, 5):
            return {"status": "fail", "reason": tail(out.stdout + out.stderr)}
        return skipped(f"dry run: {count} gpu tests collected, not run (they need {args.device})", collected=count)
    out = run([args.vllm_python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rs", *files], 420, env)
    summary = tail(out.stdout, 1)
    return {"status": "pass" if out.returncode == 0 else "fail", "summary": summary,
            **({} if out.returncode == 0 else {"reason": tail(out.stdout + out.stderr, 30)})}


def rollout_batching(args, device: str, tmp: Path) -> dict:
    figures, status, reasons = {}, "pass", []
    no_vllm = None if args.dry_run else missing_vllm(args.vllm_python)
    for name, model_args in BATCHING_MODELS.items():
        out_file = tmp / f"batching_{name}.json"
        if args.dry_run or no_vllm:
            # The native arm alone (the vllm_omni arm needs CUDA and vllm-omni).
            small = ["--num-samples", "4", "--steps", "2", "--max-num-seqs", "1", "4"] if args.dry_run else \
                ["--num-samples", "32", "--steps", "10", "--max-num-seqs", "1", "8", "32"]
            cmd = [sys.executable, "benchmarks/rollout_batching.py", *model_args, "--device", device, *small,
                   "--repeats", "1", "--out", str(out_file)]
            if args.dry_run:
                cmd += ["--threads", "1"]
            reasons.append("dry run" if args.dry_run else no_vllm)
        else:
            cmd = [args.vllm_python, "benchmarks/rollout_batching.py", *model_args, "--backend", "vllm_omni",
                   "--device", device, "--max-num-seqs", "1", "8", "32", "--out", str(out_file)]
        out = run(cmd, 300)
        if out.returncode != 0:
            status, figures[name] = "fail", {"error": tail(out.stdout + out.stderr)}
            continue
        result = json.loads(out_file.read_text())
        figures[name] = {k: v for k, v in result.items() if k not in ("machine", "args")}
    if status == "pass" and reasons:
        return skipped(f"vllm_omni arm not run ({reasons[0]}); native arm only", **figures)
    return {"status": status, **figures}


def recipes(args, device: str, tmp: Path) -> dict:
    from omni_rl.config import available_recipes

    names = DRY_RUN_RECIPES if args.dry_run else sorted(n for n in available_recipes() if n.startswith("tiny_"))
    steps, dtype = (1, "float32") if args.dry_run else (args.recipe_steps, "bfloat16")
    figures, status = {}, "pass"
    for name in names:
        run_dir = tmp / name
        cmd = [sys.executable, "main_omni.py", f"recipe={name}", f"trainer.total_steps={steps}", f"model.dtype={dtype}",
               f"trainer.device={device}", "trainer.val_every=0", "trainer.save_every=0", "trainer.logger_options.progress_bar=false",
               "trainer.loggers=[jsonl]", f"trainer.output_dir={run_dir}"]
        started = time.monotonic()
        try:
            out = run(cmd, 240 if args.dry_run else 120, {"OMNI_RL_CACHE": os.environ.get("OMNI_RL_CACHE", str(tmp / "cache"))})
        except subprocess.TimeoutExpired:
            status, figures[name] = "fail", {"error": "timed out"}
            continue
        seconds = round(time.monotonic() - started, 1)
        if out.returncode != 0:
            status, figures[name] = "fail", {"error": tail(out.stderr), "seconds": seconds}
            continue
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        trained = [r for r in records if RATIO_KEY in r]
        first = trained[0] if trained else {}
        figures[name] = {
            "steps": len(trained), "seconds": seconds,
            **{key.split("/")[-1]: first.get(key) for key in GAP_KEYS},
            "first_minibatch_ratio_max_abs_dev": max((r[RATIO_KEY] for r in trained), default=None),
            "reward_first": first.get("reward/total/mean"), "reward_last": trained[-1].get("reward/total/mean") if trained else None,
        }
    result = {"status": status, "dtype": dtype, "steps": steps, **figures}
    if args.dry_run and status == "pass":
        return skipped(f"dry run: {len(names)} recipes, {steps} step in {dtype} on the CPU; every tiny recipe in "
                       f"bf16 needs {args.device}", **{k: v for k, v in result.items() if k != "status"})
    return result


SLEEP_WAKE = r"""
import json, sys, torch
from omni_rl.compose import bind_blocks
from omni_rl.config.schema import ModelConfig, OmniConfig
from omni_rl.models import build_model
from omni_rl.rollout.backends import build_rollout_engine
from omni_rl.rollout.types import DiffusionRequest
device = sys.argv[1]
cfg = OmniConfig(); cfg.model = ModelConfig(path="tiny:sd3"); cfg.trainer.device = device
cfg.rollout.backend, cfg.rollout.backend_options = "vllm_omni", {"enforce_eager": True}
bind_blocks(cfg)  # every options block bound, as in a run's config
torch.manual_seed(cfg.trainer.seed)
model = build_model(cfg.model, torch.device(device))
engine = build_rollout_engine(cfg, model)
reqs = lambda: [DiffusionRequest(prompt="a cube", seed=i, height=32, width=32, num_steps=4, guidance_scale=4.5,
                                 kernel="ode", noise_level=0.0) for i in range(2)]
try:
    before = engine.generate(reqs(), timeout_s=300)
    awake = torch.cuda.mem_get_info()[0]; engine.sleep(); asleep = torch.cuda.mem_get_info()[0]; engine.wake()
    after = engine.generate(reqs(), timeout_s=300)
finally:
    engine.close()
weights = sum(p.numel() * p.element_size() for m in [*model.trainable_modules().values(), *model.frozen_modules()]
              for p in m.parameters())
same = all(torch.equal(a.final_latent, b.final_latent) for a, b in zip(before, after))
print(json.dumps({"freed_mib": (asleep - awake) / 2**20, "weights_mib": weights / 2**20, "same_after_wake": same}))
"""


def sleep_wake(args, device: str) -> dict:
    if args.dry_run:
        return skipped("dry run: needs CUDA and vllm-omni")
    no_vllm = missing_vllm(args.vllm_python)
    if no_vllm:
        return skipped(no_vllm)
    out = run([args.vllm_python, "-c", SLEEP_WAKE, device], 300)
    if out.returncode != 0:
        return {"status": "fail", "reason": tail(out.stdout + out.stderr)}
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    ok = figures["freed_mib"] >= 0.5 * figures["weights_mib"] and figures["same_after_wake"]
    return {"status": "pass" if ok else "fail", **figures}


def memory_plan(args, device: str) -> dict:
    return skipped("no real-size planner (--plan) in this tree yet: nothing to compare max_memory_allocated with")


PARTS: dict[str, Callable] = {"gpu_tests": gpu_tests, "rollout_batching": rollout_batching, "recipes": recipes,
                              "sleep_wake": sleep_wake, "memory_plan": memory_plan}


# --- the machine ----------------------------------------------------------------------------------
def machine(device: str) -> dict:
    import torch

    info = {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "device": device, "torch_cuda": torch.version.cuda,
            "packages": {}}
    for name in PACKAGES:
        try:
            info["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info["packages"][name] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
        try:
            smi = run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], 30)
            info["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            info["driver"] = None
    return info


def print_table(result: dict) -> None:
    m = result["machine"]
    print(f"gpu_acceptance on {m.get('gpu', m['device'])} (driver {m.get('driver')}, torch {m['packages']['torch']}, "
          f"vllm {m['packages']['vllm']}, vllm-omni {m['packages']['vllm-omni']}){' [dry run]' if result['dry_run'] else ''}")
    print(f"{'part':<18}{'status':<9}{'seconds':>8}  detail")
    for name, part in result["parts"].items():
        detail = part.get("reason") or part.get("summary") or ""
        print(f"{name:<18}{part['status']:<9}{part.get('seconds', 0):>8.1f}  {detail.splitlines()[0] if detail else ''}")
    recipes_part = result["parts"].get("recipes", {})
    for name, fig in recipes_part.items():
        if isinstance(fig, dict) and "steps" in fig:
            print(f"  {name:<32} gap mean {fig.get('logprob_abs_diff_mean')}  max {fig.get('logprob_abs_diff_max')}  "
                  f"first mini-batch ratio dev {fig.get('first_minibatch_ratio_max_abs_dev')}")


def main(argv=None) -> int:
    args = parse_args(argv)
    device = "cpu" if args.dry_run else args.device
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print(f"error: --device={args.device}: no CUDA device here; run with --dry-run to check the script on a CPU",
                  file=sys.stderr)
            return 2
    result = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "dry_run": args.dry_run,
              "machine": machine(device), "parts": {}}
    names = [name for name in PARTS if not args.only or name in args.only]
    with tempfile.TemporaryDirectory(prefix="omni-rl-acceptance-") as folder:
        tmp = Path(folder)

        def one(name: str) -> dict:
            started = time.monotonic()
            try:
                takes_tmp = name in ("rollout_batching", "recipes")
                outcome = PARTS[name](args, device, tmp) if takes_tmp else PARTS[name](args, device)
            except subprocess.TimeoutExpired as err:
                outcome = {"status": "fail", "reason": f"timed out after {err.timeout:.0f} s"}
            outcome["seconds"] = round(time.monotonic() - started, 1)
            return outcome

        # On the GPU the parts run one after the other (each wants the device's memory); a dry run
        # runs them side by side, their processes mostly waiting on imports.
        with ThreadPoolExecutor(max_workers=len(names) if args.dry_run else 1) as pool:
            outcomes = list(pool.map(one, names))
        result["parts"] = dict(zip(names, outcomes))
    atomic_write_json(Path(args.out), result)
    print_table(result)
    print(f"wrote {args.out}")
    return 1 if any(p["status"] == "fail" for p in result["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Eager against compiled (`model.compile_options`): per-step time, compile cost, recompiles, numerics.

Timing (the default): each arm is `python main_omni.py recipe=R` for `--steps` steps in a fresh
process (no validation, no checkpoint, no progress bar), with `OMP_NUM_THREADS` set to the arm's
thread count. The arms:

- `eager`: the recipe as it is;
- `cold`: `model.compile_options.enabled=true` with an empty inductor cache of its own;
- `cached`: the same, right after `cold`, reading the cache `cold` wrote;
- `trace`: `backend=aot_eager` (dynamo's and AOTAutograd's tracing, eager kernels, no inductor):
  its compile cost is the part no inductor cache removes, which bounds what `cached` can save.

Rounds alternate the arms at every thread count (`--threads`, 1 and 2), so the machine's own load
drifts over all of them alike; each run records the load average it started at. From each run's
metrics.jsonl: rollout and update seconds per step (medians over the steps after the first), the
first step's seconds (compilation happens there: the compile cost of an arm is its first step
less eager's), and `perf/compiled_graphs` (recompiles after warm-up: its rise after step 1). The
break-even step count is the compile cost over the per-step saving; the projected whole run is
the recipe's `trainer.total_steps` at the measured step time plus the first step and the start-up.

    python benchmarks/compile.py --recipe tiny_sd3_flowgrpo --steps 6 --threads 1 2
    python benchmarks/compile.py --recipe tiny_wan22_flowgrpo --steps 4 --threads 2 --out ...

Rollout split (`--split`): an SD3 recipe's rollout of `max_num_seqs` samples at each `--threads`,
eager and compiled: the part inside the transformer's forward (`predict_velocity`), and the share
in library kernels (GEMMs, attention, convolution), which a compiled graph calls unchanged: the
compiled arm's library time over eager's rollout is the floor compilation cannot go below.

    python benchmarks/compile.py --split --recipe tiny_sd3_shapes_counting --threads 1 2

Numerics (`--numerics`): for each tiny diffusion adapter (the shared suite's cases), one
forward of the eager and the inductor-compiled model on the same inputs (a batch across the
schedule, with CFG): max |delta| of the velocity. For the demo model also the per-step max
|delta log-prob| of a rollout of the same requests, eager against compiled.

    python benchmarks/compile.py --numerics --out benchmarks/results/compile_numerics.json
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `tests.adapters` for --numerics

from benchmarks.timed_runs import arm_env, timed_run  # noqa: E402
from omni_rl.utils.atomic import atomic_write_json  # noqa: E402

ARMS = ("eager", "cold", "cached", "trace")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="tiny_sd3_flowgrpo")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS, help="eager first (the others are compared with it)")
    p.add_argument("--override", action="append", default=[], help="KEY=VALUE for every arm (repeatable)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    p.add_argument("--numerics", action="store_true", help="compiled-vs-eager forwards instead of timing")
    p.add_argument("--adapters", nargs="*", default=None, help="--numerics: the suite's adapter names (default all)")
    p.add_argument("--split", action="store_true", help="where an SD3 recipe's rollout time goes, eager and compiled")
    p.add_argument("--cache-dir", default=None, help="--split: the inductor cache to compile from")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def run_once(args, arm: str, threads: int, out: Path, cache: Path) -> dict:
    overrides = [f"recipe={args.recipe}", f"trainer.total_steps={args.steps}", *args.override]
    if arm != "eager":
        overrides += ["model.compile_options.enabled=true", f"model.compile_options.cache_dir={cache}"]
    if arm == "trace":
        overrides += ["model.compile_options.backend=aot_eager"]
    run = timed_run(overrides, out, arm_env(OMP_NUM_THREADS=str(threads)), args.timeout_s, f"{arm} at {threads} threads")
    if run.timed_out:
        return {"wall_s": run.wall_s, "timed_out": True, "load_at_start": run.load_at_start}
    steps = [r for r in run.rows if "timing/step" in r]
    col = lambda key: [r.get(key) for r in steps]  # noqa: E731
    rollout_key = "timing/rollout" if "timing/rollout" in steps[0] else next(k for k in steps[0] if k.startswith("timing/"))
    graphs = [g for g in col("perf/compiled_graphs") if g is not None]
    return {"wall_s": run.wall_s, "cpu_s": run.cpu_s, "timed_out": False, "load_at_start": run.load_at_start,
            "step_s": col("timing/step"), "rollout_s": col(rollout_key), "update_s": col("timing/update"),
            "compiled_graphs": graphs, "recompiles_after_warmup": (graphs[-1] - graphs[0]) if graphs else 0,
            "rewards": col("reward/total/mean")}


def _median_after_first(values: list) -> float:
    rest = values[1:] or values
    return statistics.median(rest)


def summarize(runs: list[dict], threads: int, total_steps: int) -> dict:
    def med(arm, fn):
        got = [fn(r) for r in runs if r["arm"] == arm and r["threads"] == threads and not r["timed_out"]]
        return statistics.median(got) if got else None

    arms = [a for a in ARMS if any(r["arm"] == a for r in runs)]
    s = {arm: {"rollout_s": med(arm, lambda r: _median_after_first(r["rollout_s"])),
               "update_s": med(arm, lambda r: _median_after_first(r["update_s"])),
               "step_s": med(arm, lambda r: _median_after_first(r["step_s"])),
               "first_step_s": med(arm, lambda r: r["step_s"][0]),
               "wall_s": med(arm, lambda r: r["wall_s"]),
               "cpu_s": med(arm, lambda r: r.get("cpu_s")) if all(r.get("cpu_s") is not None for r in runs) else None,
               "recompiles_after_warmup": med(arm, lambda r: r["recompiles_after_warmup"]),
               "graphs_compiled": med(arm, lambda r: r["compiled_graphs"][-1] if r["compiled_graphs"] else 0)}
         for arm in arms}
    e = s["eager"]
    for arm in [a for a in ("cold", "cached", "trace") if a in s]:
        a = s[arm]
        if a["step_s"] is None or e["step_s"] is None:
            continue
        a["rollout_ratio"] = a["rollout_s"] / e["rollout_s"]
        a["update_ratio"] = a["update_s"] / e["update_s"]
        a["step_ratio"] = a["step_s"] / e["step_s"]
        a["compile_s"] = a["first_step_s"] - e["first_step_s"]
        saving = e["step_s"] - a["step_s"]
        a["break_even_steps"] = a["compile_s"] / saving if saving > 0 else None
        # The recipe's whole run: start-up and first step as measured, then its steps at this pace.
        startup = a["wall_s"] - sum([a["first_step_s"]] + [a["step_s"]] * (len(runs[0]["step_s"]) - 1))
        a["projected_whole_run_s"] = startup + a["first_step_s"] + a["step_s"] * (total_steps - 1)
    startup = e["wall_s"] - sum([e["first_step_s"]] + [e["step_s"]] * (len(runs[0]["step_s"]) - 1))
    e["projected_whole_run_s"] = startup + e["first_step_s"] + e["step_s"] * (total_steps - 1)
    if "cold" in s and "cached" in s and s["cold"].get("compile_s") and s["cached"].get("compile_s") is not None:
        s["cached_over_cold_compile"] = s["cached"]["compile_s"] / s["cold"]["compile_s"]
    return s


def timing(args) -> dict:
    from omni_rl.compose import load_config

    total_steps = load_config([f"recipe={args.recipe}"]).trainer.total_steps
    runs = []
    with tempfile.TemporaryDirectory(prefix="compile_bench_") as tmp:
        for rnd in range(args.rounds):
            for threads in args.threads:
                cache = Path(tmp) / f"inductor_{threads}_{rnd}"  # cold: empty; cached: what cold wrote
                for arm in args.arms:
                    out = Path(tmp) / f"{arm}_{threads}_{rnd}"
                    result = run_once(args, arm, threads, out, cache)
                    runs.append({"arm": arm, "threads": threads, "round": rnd, **result})
                    first = result.get("step_s", [float("nan")])[0]
                    print(f"round {rnd} {threads}t {arm:7s} wall {result['wall_s']:7.1f} s  first step {first:7.1f} s  "
                          f"recompiles {result.get('recompiles_after_warmup')}  load {result['load_at_start']:.1f}",
                          flush=True)
    return {"recipe": args.recipe, "steps": args.steps, "rounds": args.rounds, "recipe_total_steps": total_steps,
            "summary": {f"{t}_threads": summarize(runs, t, total_steps) for t in args.threads}, "runs": runs}


def numerics(args) -> dict:
    """Max |delta| of compiled vs eager forwards for every tiny diffusion adapter (fp32)."""
    import torch

    from omni_rl.models.compile import CompileOptions
    from tests.adapters.diffusion_suite import compiled_forward_delta, suite_cases

    results = {}
    for name, case in suite_cases().items():
        if args.adapters and name not in args.adapters:
            continue
        t0 = time.perf_counter()
        delta = compiled_forward_delta(case, CompileOptions(enabled=True, backend="inductor"))
        results[name] = {"max_abs_delta": delta, "seconds": time.perf_counter() - t0}
        print(f"{name:28s} max |delta| {delta:.3e}  ({results[name]['seconds']:.0f} s)", flush=True)
    demo = rollout_log_prob_delta(CompileOptions(enabled=True, backend="inductor"))
    print(f"demo (tiny SD3) per-step max |delta log-prob|: {demo}")
    return {"threads": torch.get_num_threads(), "forward": results, "demo_log_prob_delta_per_step": demo}


def rollout_log_prob_delta(options) -> list[float]:
    """The demo model (tiny_sd3_flowgrpo's, with its LoRA) eager and compiled with `options`: one
    rollout of the same 8 requests (the recipe's 6 steps, CFG 4.5, SDE at noise level 0.7 on every
    step), max |delta log-prob| over the samples at each step."""
    import dataclasses

    import torch

    from omni_rl.compose import load_config
    from omni_rl.models import build_model
    from tests.adapters.diffusion_suite import generate, request, suite_cases

    cfg = load_config(["recipe=tiny_sd3_flowgrpo"])
    case = dataclasses.replace(suite_cases()["TestSD3"], steps=cfg.rollout.sampling_options.num_steps, guidance=cfg.rollout.sampling_options.guidance_scale)
    torch.manual_seed(0)
    eager = build_model(cfg.model, torch.device("cpu"))
    compiled = build_model(dataclasses.replace(cfg.model, compile_options=options), torch.device("cpu"))
    compiled.load_named_tensors(eager.named_trainable_tensors())
    prompts = list(cfg.data.prompts)
    requests = [request(case, p, seed=i, sde_window_size=0, sde_window_range=None) for i, p in enumerate(prompts)]
    want, _ = generate(eager, requests, max_num_seqs=len(requests))
    got, _ = generate(compiled, requests, max_num_seqs=len(requests))
    deltas = torch.stack([(g.log_probs - w.log_probs).abs() for g, w in zip(got, want)])  # [samples, steps]
    return [float(v) for v in deltas.max(dim=0).values]


# Library kernels: the ops a compiled graph calls as they are (inductor's extern kernels), with
# the time eager spends in them. What compilation can shorten is everything else.
LIBRARY_KERNELS = {
    "gemm": ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
                  "aten::_scaled_dot_product_efficient_attention"),
    "convolution": ("aten::mkldnn_convolution", "aten::_slow_conv2d_forward", "aten::_convolution_mode"),
}


def kernel_seconds(profile) -> dict:
    """Self CPU seconds of a `torch.profiler` run, per library-kernel category, and the total."""
    events = profile.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    out = {kind: sum(e.self_cpu_time_total for e in events if e.key in names) / 1e6
           for kind, names in LIBRARY_KERNELS.items()}
    out["library"] = sum(out[kind] for kind in LIBRARY_KERNELS)
    out["total"] = total
    return out


def rollout_split(recipe: str, threads: int, cache_dir: str | None, reps: int = 5) -> dict:
    """Where a recipe's rollout time goes, eager and compiled: one rollout of `max_num_seqs`
    samples (warm-up, then the median of `reps` with the two arms alternated), the part of it
    inside `predict_velocity` (the transformer with CFG, counted by wrapping the adapter
    instance's method), and, from one more rollout under `torch.profiler`, the share in library
    kernels (GEMMs, attention, convolution). A compiled graph calls those kernels unchanged, so
    the compiled arm's library seconds over eager's whole rollout is the best ratio compilation
    can reach without faster kernels (the `floor_ratio`)."""
    import dataclasses

    import torch
    from torch.profiler import ProfilerActivity, profile

    from omni_rl.compose import load_config
    from omni_rl.models import build_model
    from omni_rl.models.compile import CompileOptions
    from tests.adapters.diffusion_suite import generate, request, suite_cases

    torch.set_num_threads(threads)
    cfg = load_config([f"recipe={recipe}"])
    sampling, batch = cfg.rollout.sampling_options, cfg.rollout.max_num_seqs
    case = dataclasses.replace(suite_cases()["TestSD3"], steps=sampling.num_steps, guidance=sampling.guidance_scale,
                               height=sampling.height, width=sampling.width)
    prompts = list(cfg.data.prompts)
    window = dict(sde_window_size=sampling.sde_window_size, noise_level=sampling.noise_level,
                  sde_window_range=tuple(sampling.sde_window_range) if sampling.sde_window_range else None)
    requests = [request(case, prompts[i % len(prompts)], seed=i, **window) for i in range(batch)]
    # Every rollout is driven by this thread (driver="caller"): the profiler records the thread it
    # started in, not the engine's own.
    models, calls = {}, {"eager": [], "compiled": []}
    for arm in ("eager", "compiled"):
        options = CompileOptions(enabled=arm == "compiled", cache_dir=cache_dir)
        torch.manual_seed(0)
        model = build_model(dataclasses.replace(cfg.model, compile_options=options), torch.device("cpu"))

        def timed(*a, _forward=model.predict_velocity, _calls=calls[arm], **k):
            t0 = time.perf_counter()
            result = _forward(*a, **k)
            _calls.append(time.perf_counter() - t0)
            return result

        model.predict_velocity = timed
        generate(model, requests, batch, driver="caller")  # warm-up: the compile
        models[arm] = model
    walls, forwards = {arm: [] for arm in models}, {arm: [] for arm in models}
    for _ in range(reps):  # the arms alternated: the machine's load falls on both alike
        for arm, model in models.items():
            calls[arm].clear()
            t0 = time.perf_counter()
            generate(model, requests, batch, driver="caller")
            walls[arm].append(time.perf_counter() - t0)
            forwards[arm].append(sum(calls[arm]))
    out = {}
    for arm, model in models.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            generate(model, requests, batch, driver="caller")
        kernels = kernel_seconds(prof)
        wall = statistics.median(walls[arm])
        # The profiler's self times add its own overhead: scale its shares to the timed wall.
        shares = {kind: kernels[kind] / kernels["total"] for kind in (*LIBRARY_KERNELS, "library")}
        out[arm] = {"rollout_s": wall, "forward_s": statistics.median(forwards[arm]), "walls_s": walls[arm],
                    "profiled": kernels, "library_share": shares["library"],
                    "library_s": {k: v * wall for k, v in shares.items()}}
    e, c = out["eager"], out["compiled"]
    return {"recipe": recipe, "threads": threads, "samples": batch, **out,
            "rollout_ratio": c["rollout_s"] / e["rollout_s"], "forward_ratio": c["forward_s"] / e["forward_s"],
            "rest_s": {arm: out[arm]["rollout_s"] - out[arm]["forward_s"] for arm in out},
            "floor_ratio": c["library_s"]["library"] / e["rollout_s"]}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.split:
        body = {"rollout_split": [rollout_split(args.recipe, t, args.cache_dir) for t in args.threads]}
        default = f"compile_rollout_split_{args.recipe}.json"
    elif args.numerics:
        body, default = numerics(args), "compile_numerics.json"
    else:
        body, default = timing(args), f"compile_{args.recipe}.json"
    out = Path(args.out or ROOT / "benchmarks" / "results" / default)
    result = {
        "benchmark": "compile", "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg()[0],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/compile.py " + " ".join(sys.argv[1:] if argv is None else argv),
        **body,
    }
    atomic_write_json(out, result)
    print(json.dumps(result.get("summary", result.get("forward")), indent=1, default=str))


if __name__ == "__main__":
    main()

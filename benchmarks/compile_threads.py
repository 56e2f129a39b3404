"""Why the compiled arm does not pay at two torch threads: one experiment per candidate cause.

Each arm is a fresh process (the OpenMP runtime reads its wait policy once, when torch loads)
that builds the demo's model (`--recipe`, its LoRA included) twice, eager and compiled
(`model.compile_options`, regional, dynamic), and then alternates, `--reps` times, the two
forwards the run spends its time in: the rollout's transformer forward of `--batch` samples with
CFG (`predict_velocity`, no grad) and a training micro-batch's forward and backward
(`--micro-batch` samples). Eager and compiled run interleaved in one process, so the machine's
load falls on both alike and their ratio is what is compared between arms; each call also
records its process CPU time (every thread's), so CPU over wall says how many threads did work
(or spun). The arms:

- `1t`: one torch thread, the project's wait policy (PASSIVE): the baseline where compiling pays;
- `2t_passive`: two threads, PASSIVE (the project's default): the case that does not pay;
- `2t_active`: two threads, `OMP_WAIT_POLICY=ACTIVE` (threads spin between parallel regions):
  tests the wake-up cost of a sleeping thread at each of inductor's parallel regions;
- `2t_spin`: two threads, `GOMP_SPINCOUNT` (`--spincount`) spins briefly, then sleeps: the middle;
- `2t_serial_kernels`: two threads, PASSIVE, inductor's kernels generated for one thread
  (`torch._inductor.config.cpp.threads=1`: no `#pragma omp parallel` in them) while aten's
  matmuls keep two: tests OpenMP fork/join per inductor kernel;
- `2t_big_chunks`: two threads, PASSIVE, inductor parallelises a kernel only where each thread
  gets at least 32768 elements (`cpp.min_chunk_size`, 512 by default; aten's own grain size is
  32768): the small kernels run serial, the large ones keep both threads.

Measurements that do not depend on wall time, per arm: the fork/join cost of one parallel region
(a compiled elementwise kernel on 8192 floats, serial against parallel codegen, in microseconds),
the parallel regions each compiled forward enters (inductor's generated kernels, read from the
arm's inductor cache, times the calls per forward), and eager's aten ops per forward with the
number large enough to fork (profiler, input elements above aten's grain size of 32768).

    python benchmarks/compile_threads.py --rounds 2

Writes JSON (`--out`, rewritten after every arm). Not here: the whole-run step times (that is
`benchmarks/compile.py`), GPU kernels.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `tests.adapters` in the child

ARMS = {
    "1t": {"threads": 1, "env": {"OMP_WAIT_POLICY": "PASSIVE"}, "cpp_threads": None},
    "2t_passive": {"threads": 2, "env": {"OMP_WAIT_POLICY": "PASSIVE"}, "cpp_threads": None},
    "2t_active": {"threads": 2, "env": {"OMP_WAIT_POLICY": "ACTIVE"}, "cpp_threads": None},
    "2t_spin": {"threads": 2, "env": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}, "cpp_threads": None},
    "2t_serial_kernels": {"threads": 2, "env": {"OMP_WAIT_POLICY": "PASSIVE"}, "cpp_threads": 1},
    "2t_big_chunks": {"threads": 2, "env": {"OMP_WAIT_POLICY": "PASSIVE"}, "cpp_threads": None, "min_chunk_size": 32768},
}
GRAIN = 32768  # at::internal::GRAIN_SIZE: aten's parallel_for runs serially below it


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="tiny_sd3_flowgrpo")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batch", type=int, default=32, help="rollout forward's samples (CFG doubles them)")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--spincount", default="20000", help="GOMP_SPINCOUNT of the 2t_spin arm")
    p.add_argument("--timeout-s", type=float, default=1800.0)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "compile_threads.json"))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------- child


def _timed(fn) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


# Two code objects for one kernel: dynamo caches compiled code per code object, so each variant keeps its own.
def _elementwise_parallel(t):
    return t * 2.0 + 1.0


def _elementwise_serial(t):
    return t * 2.0 + 1.0


def fork_join_us(rounds: int = 10, calls: int = 300) -> dict:
    """Microseconds per call of one compiled elementwise kernel on 8192 floats, generated with a
    parallel region (inductor's default at this thread count) and serial (cpp.threads=1), the two
    alternated `rounds` times: the difference of their medians is what one fork/join costs here
    (zero at one thread, where inductor generates no parallel region)."""
    import torch
    import torch._inductor.config as ic

    x = torch.randn(8192)
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    fns = {}
    with tempfile.TemporaryDirectory(prefix="fork_join_") as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp  # kept out of the arm's cache, whose kernels are counted
        for name, threads, fn in (("parallel", -1, _elementwise_parallel), ("serial", 1, _elementwise_serial)):
            with ic.patch({"cpp.threads": threads, "cpp.min_chunk_size": 1}):
                fns[name] = torch.compile(fn, dynamic=False)
                fns[name](x)  # compiles now, under the patched configuration
        if saved is not None:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved
    per_call = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(x)
            per_call[name].append((time.perf_counter() - t0) / calls * 1e6)
    out = {name: statistics.median(v) for name, v in per_call.items()}
    out["fork_join_us"] = out["parallel"] - out["serial"]
    return out


def eager_op_counts(model, run) -> dict:
    """aten ops one eager call enters, and those whose largest input exceeds aten's grain size
    (the only ones that can open a parallel region; matmuls go to BLAS, counted apart)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    # Top-level aten ops only: an op called inside another (addmm inside linear) is not counted twice.
    ops = [e for e in prof.events()
           if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    matmul = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
              "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention"}

    def numel(shapes) -> int:
        best = 0
        for s in shapes or []:
            if isinstance(s, (list, tuple)) and s and all(isinstance(d, int) for d in s):
                n = 1
                for d in s:
                    n *= d
                best = max(best, n)
        return best

    big = [e for e in ops if e.name not in matmul and numel(e.input_shapes) > GRAIN]
    del torch
    return {"top_level_aten_ops": len(ops), "matmul_ops": sum(e.name in matmul for e in ops),
            "other_ops_above_grain": len(big), "other_ops_below_grain": len(ops) - len(big) - sum(e.name in matmul for e in ops)}


def child(spec: dict) -> dict:
    import dataclasses

    import torch
    import torch._inductor.config as ic

    from omni_rl.compose import load_config
    from omni_rl.models import build_model
    from omni_rl.models.compile import CompileOptions, compiled_graphs
    from tests.adapters.diffusion_suite import encode, initial_noise, suite_cases

    if spec["cpp_threads"]:
        ic.cpp.threads = spec["cpp_threads"]
    if spec.get("min_chunk_size"):
        ic.cpp.min_chunk_size = spec["min_chunk_size"]
    cfg = load_config([f"recipe={spec['recipe']}"])
    case = dataclasses.replace(suite_cases()["TestSD3"], height=cfg.rollout.sampling_options.height, width=cfg.rollout.sampling_options.width)
    torch.manual_seed(0)
    eager = build_model(cfg.model, torch.device("cpu"))
    compiled = build_model(dataclasses.replace(cfg.model, compile_options=CompileOptions(
        enabled=True, cache_dir=spec["cache_dir"])), torch.device("cpu"))
    compiled.load_named_tensors(eager.named_trainable_tensors())
    n, m = spec["batch"], spec["micro_batch"]
    sigmas = eager.sigmas(cfg.rollout.sampling_options.num_steps, case.height, case.width)[:-1]
    sig = sigmas.repeat(n // len(sigmas) + 1)[:n]
    x = torch.stack([initial_noise(eager, case, seed=s) for s in range(n)])
    prompts = list(cfg.data.prompts)
    cond = encode(case, eager, [prompts[i % len(prompts)] for i in range(n)])
    cond_m = encode(case, eager, [prompts[i % len(prompts)] for i in range(m)])
    g = cfg.rollout.sampling_options.guidance_scale

    def rollout(model):
        with torch.no_grad():
            model.predict_velocity(x, sig, cond, g)

    def train(model):
        params = list(model.trainable_parameters())
        v = model.predict_velocity(x[:m], sig[:m], cond_m, g)
        v.pow(2).mean().backward()
        for p in params:
            p.grad = None

    t0 = time.perf_counter()
    for _ in range(2):  # compile (or load from the arm's cache) and warm both
        for model in (eager, compiled):
            rollout(model)
            train(model)
    warm_s = time.perf_counter() - t0
    graphs_after_warmup = compiled_graphs()
    samples = {f"{arm}_{part}": {"wall": [], "cpu": []} for arm in ("eager", "compiled") for part in ("rollout", "train")}
    for _ in range(spec["reps"]):
        for arm, model in (("eager", eager), ("compiled", compiled)):
            for part, fn in (("rollout", rollout), ("train", train)):
                wall, cpu = _timed(lambda: fn(model))
                samples[f"{arm}_{part}"]["wall"].append(wall)
                samples[f"{arm}_{part}"]["cpu"].append(cpu)
    med = {k: {"wall_s": statistics.median(v["wall"]), "cpu_s": statistics.median(v["cpu"]),
               "cpu_over_wall": statistics.median(c / w for c, w in zip(v["cpu"], v["wall"]))}
           for k, v in samples.items()}
    block_classes = tuple(compiled.compile_block_classes())
    blocks = [b for mod in compiled.trainable_modules().values() for b in mod.modules() if isinstance(b, block_classes)]
    return {"torch_threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"), "inductor_cpp_threads": ic.cpp.threads,
            "inductor_min_chunk_size": ic.cpp.min_chunk_size,
            "warmup_s": warm_s, "recompiles_after_warmup": compiled_graphs() - graphs_after_warmup,
            "compiled_blocks": len(blocks), "samples": samples, "median": med,
            "rollout_ratio": med["compiled_rollout"]["wall_s"] / med["eager_rollout"]["wall_s"],
            "train_ratio": med["compiled_train"]["wall_s"] / med["eager_train"]["wall_s"],
            "eager_ops_rollout": eager_op_counts(eager, lambda: rollout(eager)),
            "eager_ops_train": eager_op_counts(eager, lambda: train(eager)),
            "fork_join": fork_join_us()}


# ------------------------------------------------------------------------------ generated code


def kernel_counts(cache_dir: Path) -> list[dict]:
    """Per compiled graph in an inductor cache: its generated cpp kernels, how many of them open an
    OpenMP parallel region, and the kernel calls (and aten fallbacks) one call of the graph makes."""
    graphs = []
    for wrapper in sorted(cache_dir.rglob("*.py")):
        text = wrapper.read_text(errors="replace")
        if "def call(" not in text or "async_compile" not in text:
            continue
        kernels = dict(re.findall(r"^(cpp_fused_\w+) = async_compile\.cpp_pybinding\((.*?)'''\)", text, re.S | re.M))
        body = text.split("def call(", 1)[1].split("\ndef ", 1)[0]
        calls = re.findall(r"^\s+(cpp_fused_\w+)\(", body, re.M)
        extern = re.findall(r"(extern_kernels\.\w+|torch\.ops\.\w+\.\w+)\(", body)
        graphs.append({"file": wrapper.name, "kernels": len(kernels),
                       "parallel_kernels": sum("#pragma omp parallel" in src for src in kernels.values()),
                       "kernel_calls": len(calls),
                       "parallel_region_calls": sum("#pragma omp parallel" in kernels.get(c, "") for c in calls),
                       "extern_calls": len(extern)})
    return graphs


# ---------------------------------------------------------------------------------------- parent


def run_arm(args, arm: str, cache: Path) -> dict:
    spec = ARMS[arm]
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "TORCHINDUCTOR_CACHE_DIR")}
    env["OMP_NUM_THREADS"] = str(spec["threads"])
    for key, value in spec["env"].items():
        env[key] = args.spincount if key == "GOMP_SPINCOUNT" else value
    child_spec = {"recipe": args.recipe, "batch": args.batch, "micro_batch": args.micro_batch, "reps": args.reps,
                  "cpp_threads": spec["cpp_threads"], "min_chunk_size": spec.get("min_chunk_size"),
                  "cache_dir": str(cache)}
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(child_spec)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=args.timeout_s)
    if proc.returncode != 0:
        raise SystemExit(f"arm {arm}: child failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"arm": arm, "load_at_start": load, "load_at_end": os.getloadavg()[0], **result}


def summarize(runs: list[dict], caches: dict[str, Path]) -> dict:
    out = {}
    for arm in ARMS:
        done = [r for r in runs if r["arm"] == arm]
        if not done:
            continue
        m = lambda f: statistics.median(f(r) for r in done)  # noqa: E731
        out[arm] = {"rollout_ratio": m(lambda r: r["rollout_ratio"]), "train_ratio": m(lambda r: r["train_ratio"]),
                    **{f"{k}_wall_s": m(lambda r, k=k: r["median"][k]["wall_s"]) for k in done[0]["median"]},
                    **{f"{k}_cpu_over_wall": m(lambda r, k=k: r["median"][k]["cpu_over_wall"]) for k in done[0]["median"]},
                    "fork_join_us": m(lambda r: r["fork_join"]["fork_join_us"]),
                    "recompiles_after_warmup": max(r["recompiles_after_warmup"] for r in done),
                    "loads": [r["load_at_start"] for r in done]}
    for arm, cache in caches.items():
        if arm in out:
            graphs = kernel_counts(cache)
            out[arm]["compiled_graphs"] = graphs
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    from omni_rl.utils.atomic import atomic_write_json

    result = {"benchmark": "compile_threads", "recipe": args.recipe, "batch": args.batch, "micro_batch": args.micro_batch,
              "reps": args.reps, "spincount": args.spincount, "cpu": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": "python benchmarks/compile_threads.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "runs": []}
    with tempfile.TemporaryDirectory(prefix="compile_threads_") as tmp:
        # One inductor cache per code generation: the thread count and cpp.threads are baked into the kernels.
        caches = {arm: Path(tmp) / "inductor_{threads}t_{cpp_threads}_{chunk}".format(
            chunk=ARMS[arm].get("min_chunk_size"), **ARMS[arm]) for arm in args.arms}
        for rnd in range(args.rounds):
            for arm in args.arms:
                r = run_arm(args, arm, caches[arm])
                result["runs"].append({"round": rnd, **r})
                result["summary"] = summarize(result["runs"], caches)
                result["load_average_at_end"] = os.getloadavg()[0]
                atomic_write_json(Path(args.out), result)
                print(f"round {rnd} {arm:18s} rollout {r['rollout_ratio']:.2f}x  train {r['train_ratio']:.2f}x  "
                      f"eager rollout {r['median']['eager_rollout']['wall_s']:.3f} s  compiled "
                      f"{r['median']['compiled_rollout']['wall_s']:.3f} s  fork/join {r['fork_join']['fork_join_us']:.1f} us  "
                      f"load {r['load_at_start']:.1f}", flush=True)
    print(json.dumps({a: {k: v for k, v in s.items() if k != "compiled_graphs"} for a, s in result["summary"].items()}, indent=1))


if __name__ == "__main__":
    main()

"""How much request-level batching buys the native rollout engine, and what the engine costs.

Measures, on a tiny model (default the tiny SD3, `tiny:sd3`; `--model-path tiny:wan22
--num-frames 5` for video, `tiny:ltx2 --num-frames 9` for audio-video, `tiny:flux --adapter FluxPipeline`
for FLUX.1), after a warm-up that is not timed:

1. samples/s (images, or videos) of `NativeDiffusionEngine.generate` at each `--max-num-seqs`
   (default 1, 8 and 32) on the very same requests (one prompt set, distinct seeds, the `sde`
   kernel with an SDE window);
2. the engine's overhead: its wall time at the largest max_num_seqs over a bare batched torch
   loop that does the same work (the same prompt encoding, initial noise, `predict_velocity` and
   `sde_step` calls on batches of that size, the same window bookkeeping and the same decode)
   with no scheduler thread, futures or per-sample state:
   overhead_fraction = engine_s / bare_s - 1.

The arms alternate inside every repeat (engine 1, 8, 32, bare, engine 1, ...), so a machine
whose load drifts slows them alike; each number is the median over repeats. The bare loop's
final latents are checked against the engine's, so both arms provably did the same work.

    python benchmarks/rollout_batching.py                      # 64 samples, 10 steps
    python benchmarks/rollout_batching.py --num-samples 32 --repeats 1 --threads 1
    python benchmarks/rollout_batching.py --model-path tiny:wan22 --num-frames 5 --max-num-seqs 1 8 \
        --max-sequence-length 32 --out benchmarks/results/rollout_batching_wan22.json

With `--backend vllm_omni` (a CUDA machine with vllm-omni: the CUDA image's /opt/vllm-omni
Python) it measures instead samples/s of the vLLM-Omni engine (`rollout.backend=vllm_omni`,
our adapter in a vLLM-Omni custom pipeline) at each `--max-num-seqs`, one engine at a time,
against the native engine at the same max_num_seqs on the same device and requests, and the
largest |final latent| difference between the two:

    /opt/vllm-omni/bin/python benchmarks/rollout_batching.py --backend vllm_omni --device cuda \
        --out benchmarks/results/rollout_batching_vllm_omni.json

Writes JSON (atomically) to --out and prints a short table. See benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from omni_rl.algos import latent_streams as ls
from omni_rl.algos.flow_sde import get_step_kernel, step_latents
from omni_rl.config.schema import ModelConfig
from omni_rl.device import pick_device, synchronize
from omni_rl.models import Conditioning, build_model
from omni_rl.models.loading import resolve_model_path
from omni_rl.models.registry import ADAPTERS
from omni_rl.plugins import load_plugins
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.sde_window import choose_sde_window
from omni_rl.rollout.types import DiffusionRequest
from omni_rl.utils.atomic import atomic_write_json

PROMPTS = (
    "a red cube on a table",
    "a photo of a corgi in the snow",
    "a watercolor painting of a lighthouse",
    "two apples and a banana",
    "a city street at night, neon lights",
    "an astronaut riding a horse",
    "a bowl of ramen, studio lighting",
    "a mountain lake at sunrise",
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default=None, help="JSON result path (default: benchmarks/results/"
                   "rollout_batching.json, or rollout_batching_vllm_omni.json with --backend vllm_omni)")
    p.add_argument("--num-samples", type=int, default=64, help="requests per timed run (each arm)")
    p.add_argument("--steps", type=int, default=10, help="denoising steps per sample")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per arm; the median is reported")
    p.add_argument("--height", type=int, default=32)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--guidance-scale", type=float, default=4.5)
    p.add_argument("--noise-level", type=float, default=0.7)
    p.add_argument("--sde-window-size", type=int, default=2, help="stochastic steps per sample (0 = all)")
    p.add_argument("--model-path", default="tiny:sd3", help="model.path (default: the tiny SD3)")
    p.add_argument("--adapter", default=None,
                   help="model.adapter (default: the model folder's own pipeline class, model_index.json)")
    p.add_argument("--num-frames", type=int, default=1, help="frames per sample (1 = images)")
    p.add_argument("--fps", type=float, default=None, help="rollout fps (default: the adapter's, else 16)")
    p.add_argument("--max-num-seqs", type=int, nargs="+", default=[1, 8, 32],
                   help="engine arms; the bare loop batches like the largest")
    p.add_argument("--max-sequence-length", type=int, default=16,
                   help="model.adapter_options.max_sequence_length (T5 text tokens; 16 as in the tiny demo recipe)")
    p.add_argument("--device", default="cpu", help="cpu, cuda[:N], npu[:N] or auto")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)")
    p.add_argument("--backend", choices=("native", "vllm_omni"), default="native",
                   help="native: the native engine vs a bare loop; vllm_omni: the vLLM-Omni engine vs native")
    args = p.parse_args(argv)
    if args.num_samples < 1 or args.steps < 1 or args.repeats < 1:
        p.error("--num-samples, --steps and --repeats must be >= 1")
    if args.sde_window_size > args.steps:
        p.error(f"--sde-window-size {args.sde_window_size} is larger than --steps {args.steps}")
    if min(args.max_num_seqs) < 1 or 1 not in args.max_num_seqs:
        p.error(f"--max-num-seqs {args.max_num_seqs}: expected values >= 1, including 1 (the speedup's baseline)")
    args.max_num_seqs = sorted(set(args.max_num_seqs))
    if args.out is None:
        suffix = "" if args.backend == "native" else f"_{args.backend}"
        args.out = f"benchmarks/results/rollout_batching{suffix}.json"
    return args


def adapter_of(args) -> str:
    """`--adapter`, or the pipeline class the model folder names (model_index.json)."""
    if args.adapter:
        return args.adapter
    import json

    index = Path(resolve_model_path(args.model_path)) / "model_index.json"
    return json.loads(index.read_text())["_class_name"]


def make_requests(args, seed_offset: int = 0, count: int | None = None) -> list[DiffusionRequest]:
    """The benchmark's requests: prompts cycle through PROMPTS, seeds are all distinct."""
    count = args.num_samples if count is None else count
    return [
        DiffusionRequest(
            prompt=PROMPTS[i % len(PROMPTS)], seed=seed_offset + i, height=args.height, width=args.width,
            num_frames=args.num_frames, fps=args.fps, num_steps=args.steps, guidance_scale=args.guidance_scale, kernel="sde",
            noise_level=args.noise_level, sde_window_size=args.sde_window_size,
        )
        for i in range(count)
    ]


@torch.no_grad()
def bare_loop(model, requests: list[DiffusionRequest], batch: int) -> list[torch.Tensor]:
    """The engine's work with none of its machinery: fixed batches of `batch` requests in order,
    each encoded, noised, denoised and decoded together. Returns the final latents."""
    device = model.device
    kernel = get_step_kernel("sde")
    finals = []
    for lo in range(0, len(requests), batch):
        chunk = requests[lo : lo + batch]
        # Prompt encoding as the engine does it: the chunk's distinct prompts in one call.
        prompts = sorted({r.prompt for r in chunk})
        encoded = model.encode_prompts(prompts, negative_prompt=chunk[0].negative_prompt)
        cond = Conditioning.cat([encoded.select([prompts.index(r.prompt)]) for r in chunk])
        first = chunk[0]
        geometry = (first.height, first.width, first.num_frames)
        shape = model.latent_shape(*geometry)
        generators = [torch.Generator(device="cpu").manual_seed(r.seed) for r in chunk]
        x = ls.to(ls.stack([ls.randn(shape, generator=g) for g in generators]), device)
        windows = [choose_sde_window(r.seed, r.num_steps, r.sde_window_size, r.sde_window_range) for r in chunk]
        sigmas = model.sigmas(first.num_steps, *geometry).to(device)
        levels = torch.tensor([r.noise_level for r in chunk], dtype=torch.float32, device=device)
        window_latents = [[] for _ in chunk]
        log_probs = [[] for _ in chunk]
        for k in range(chunk[0].num_steps):
            in_window = torch.tensor([a <= k < b for a, b in windows], device=device)
            sigma = sigmas[k].expand(len(chunk))
            velocity = model.predict_velocity(x, sigma, cond, chunk[0].guidance_scale)
            step = step_latents(
                kernel, model_output=velocity, sigma=sigma, sigma_next=sigmas[k + 1].expand(len(chunk)), sample=x,
                noise_level=torch.where(in_window, levels, torch.zeros_like(levels)), generator=generators,
            )
            # The same trajectory record the engine keeps (window latents and log-probs).
            for i, (a, b) in enumerate(windows):
                if a <= k < b:
                    window_latents[i].append(ls.to(ls.index(x, i), "cpu"))
                    log_probs[i].append(step.log_prob[i].cpu())
                if k + 1 == b:
                    window_latents[i].append(ls.to(ls.index(step.prev_sample, i), "cpu"))
            x = step.prev_sample
        model.decode(x)
        if model.makes_audio:
            model.decode_audio(x)
        synchronize(device)
        finals.extend(ls.index(ls.to(x, "cpu"), i) for i in range(len(chunk)))
    return finals


def machine_info(device: torch.device) -> dict:
    info = {
        "cpu_count": os.cpu_count(),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": str(device),
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    if hasattr(os, "getloadavg"):
        info["load_average_1m_at_start"] = round(os.getloadavg()[0], 2)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def vllm_omni_main(args, model, adapter: str, device: torch.device) -> dict:
    """samples/s of the vLLM-Omni engine and of the native engine at each max_num_seqs."""
    from omni_rl.compose import bind_blocks
    from omni_rl.config.schema import OmniConfig
    from omni_rl.rollout.backends import build_rollout_engine

    arms: dict[str, dict] = {}
    for n in args.max_num_seqs:
        cfg = OmniConfig()
        cfg.model = ModelConfig(adapter=adapter, path=args.model_path, adapter_options={"max_sequence_length": args.max_sequence_length})
        cfg.trainer.device = str(device)
        cfg.rollout.backend, cfg.rollout.max_num_seqs = "vllm_omni", n
        bind_blocks(cfg)  # every options block bound, as in a run's config
        engines = {"vllm_omni": build_rollout_engine(cfg, model), "native": NativeDiffusionEngine(model, max_num_seqs=n)}
        try:
            walls: dict[str, list[float]] = {name: [] for name in engines}
            finals = {}
            for name, engine in engines.items():  # warm-up, not timed
                engine.generate(make_requests(args, seed_offset=10**6, count=min(args.num_samples, max(n, 4))))
            for _ in range(args.repeats):
                for name, engine in engines.items():
                    seconds, results = timed(lambda: engine.generate(make_requests(args)))
                    walls[name].append(seconds)
                    finals[name] = [r.final_latent for r in results]
            diff = max(float((ls.flat(ls.stack([a])) - ls.flat(ls.stack([b]))).abs().max())
                       for a, b in zip(finals["vllm_omni"], finals["native"]))
        finally:
            for engine in engines.values():
                engine.close()
        arms[str(n)] = {
            "images_per_s": {name: args.num_samples / statistics.median(w) for name, w in walls.items()},
            "wall_s": walls, "max_abs_diff_final_latent_vs_native": diff,
        }
    result = {
        "benchmark": "rollout_batching_vllm_omni",
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(device),
        "settings": {
            "backend": "vllm_omni", "model_path": args.model_path, "adapter": adapter, "num_samples": args.num_samples,
            "steps": args.steps, "repeats": args.repeats, "height": args.height, "width": args.width,
            "num_frames": args.num_frames, "guidance_scale": args.guidance_scale, "kernel": "sde",
            "noise_level": args.noise_level, "sde_window_size": args.sde_window_size,
            "max_num_seqs": list(args.max_num_seqs),
        },
        "arms": arms,
    }
    atomic_write_json(args.out, result)
    print(f"{'max_num_seqs':<14}{'vllm_omni/s':>12}{'native/s':>12}{'max |diff|':>12}")
    for n, arm in arms.items():
        ips = arm["images_per_s"]
        print(f"{n:<14}{ips['vllm_omni']:>12.2f}{ips['native']:>12.2f}{arm['max_abs_diff_final_latent_vs_native']:>12.1e}")
    print(f"wrote {Path(args.out)}")
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    adapter = adapter_of(args)
    model_cfg = ModelConfig(adapter=adapter, path=args.model_path)
    load_plugins(())  # the adapters' registry, for the options class
    model_cfg.adapter_options = ADAPTERS.get(adapter).options_class(max_sequence_length=args.max_sequence_length)
    model = build_model(model_cfg, device)
    if args.fps is None:
        args.fps = float(getattr(model, "frame_rate", 16.0))
    if args.backend == "vllm_omni":
        return vllm_omni_main(args, model, adapter, device)
    info = machine_info(device)
    seqs, bare_batch = tuple(args.max_num_seqs), max(args.max_num_seqs)

    engines = {n: NativeDiffusionEngine(model, max_num_seqs=n) for n in seqs}
    try:
        # Warm-up (not timed): every arm once, on other seeds, so lazy inits, allocator growth
        # and the sigma cache are paid before the clock runs.
        for n, engine in engines.items():
            engine.generate(make_requests(args, seed_offset=10**6, count=min(args.num_samples, max(n, 4))))
        bare_loop(model, make_requests(args, seed_offset=10**6, count=min(args.num_samples, 4)), bare_batch)

        walls: dict[str, list[float]] = {f"engine_{n}": [] for n in seqs}
        walls[f"bare_{bare_batch}"] = []
        max_diff = 0.0
        for _ in range(args.repeats):
            for n, engine in engines.items():
                # Fresh request objects with identical contents in every arm and repeat.
                seconds, results = timed(lambda: engine.generate(make_requests(args)))
                walls[f"engine_{n}"].append(seconds)
                if n == bare_batch:
                    engine_finals = [r.final_latent for r in results]
            seconds, bare_finals = timed(lambda: bare_loop(model, make_requests(args), bare_batch))
            walls[f"bare_{bare_batch}"].append(seconds)
            max_diff = max(max_diff, max(float((ls.flat(ls.stack([a])) - ls.flat(ls.stack([b]))).abs().max())
                                         for a, b in zip(engine_finals, bare_finals)))
        forwards = {n: dict(e.stats) for n, e in engines.items()}
    finally:
        for engine in engines.values():
            engine.close()

    median = {name: statistics.median(values) for name, values in walls.items()}
    images_per_s = {str(n): args.num_samples / median[f"engine_{n}"] for n in seqs}
    result = {
        "benchmark": "rollout_batching",
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": info,
        "settings": {
            "model_path": args.model_path, "adapter": adapter, "num_samples": args.num_samples, "steps": args.steps,
            "repeats": args.repeats, "height": args.height, "width": args.width,
            "num_frames": args.num_frames, "fps": args.fps,
            "guidance_scale": args.guidance_scale, "kernel": "sde", "noise_level": args.noise_level,
            "sde_window_size": args.sde_window_size, "max_sequence_length": args.max_sequence_length,
            "prompts": list(PROMPTS),
            "max_num_seqs": list(seqs), "bare_batch": bare_batch,
        },
        "images_per_s": images_per_s,
        "speedup_over_1": {str(n): images_per_s[str(n)] / images_per_s["1"] for n in seqs if n != 1},
        "overhead": {
            "engine_s": median[f"engine_{bare_batch}"],
            "bare_s": median[f"bare_{bare_batch}"],
            "bare_images_per_s": args.num_samples / median[f"bare_{bare_batch}"],
            "overhead_fraction": median[f"engine_{bare_batch}"] / median[f"bare_{bare_batch}"] - 1,
            "max_abs_diff_final_latent": max_diff,
        },
        "wall_s": walls,
        # Cumulative over warm-up and timed runs: mean batch per transformer forward.
        "engine_mean_forward_batch": {
            str(n): s["forward_batch_sum"] / max(s["forwards"], 1) for n, s in forwards.items()
        },
    }
    atomic_write_json(args.out, result)
    print_table(result)
    print(f"wrote {Path(args.out)}")
    return result


def print_table(result: dict) -> None:
    s, o = result["settings"], result["overhead"]
    m = result["machine"]
    frames = f" x {s['num_frames']} frames" if s.get("num_frames", 1) > 1 else ""
    print(f"rollout batching: {s['model_path']}, {s['num_samples']} samples x {s['steps']} steps, "
          f"{s['height']}x{s['width']} px{frames}, "
          f"{m['device']}, torch {m['torch_version']}, {m['torch_threads']} threads, median of {s['repeats']}")
    print(f"{'arm':<22}{'samples/s':>10}{'wall s':>10}{'speedup':>10}")
    for n in s["max_num_seqs"]:
        ips = result["images_per_s"][str(n)]
        speed = result["speedup_over_1"].get(str(n), 1.0)
        print(f"{'engine max_num_seqs=' + str(n):<22}{ips:>10.2f}{s['num_samples'] / ips:>10.3f}{speed:>9.2f}x")
    print(f"{'bare loop, batch ' + str(s['bare_batch']):<22}{o['bare_images_per_s']:>10.2f}{o['bare_s']:>10.3f}")
    print(f"engine overhead at {s['bare_batch']}: {100 * o['overhead_fraction']:+.1f}% "
          f"(max |final latent diff| engine vs bare: {o['max_abs_diff_final_latent']:.1e})")


if __name__ == "__main__":
    main()

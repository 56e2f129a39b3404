"""What micro-batching buys reward scoring: one-at-a-time versus micro-batched samples/s.

Two scorers, the way the trainer uses them (through a `RewardManager`):

- `clip_score` on a tiny random-weight CLIP (built with `rewards.tiny_models.build_tiny_clip`,
  saved and loaded back like a real checkpoint), on random 64x64 images;
- `ocr` (RapidOCR's real PP-OCRv4 models, shipped in its wheel) on 256x64 images of text
  rendered with PIL.

Arms, each on the same samples after an untimed warm-up:

1. `one_at_a_time`: `manager.score` called once per sample (B = 1);
2. `micro_batched`: samples submitted one by one to `AsyncRewardScorer` (as a rollout engine
   finishes them) with `max_batch_size` 16 and `max_wait_ms` 20, then gathered.

    python benchmarks/reward_batching.py            # writes benchmarks/results/reward_batching.json

Each number is the median of `--repeats` runs; timings with `time.perf_counter`.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont

from omni_rl.reward.async_scorer import AsyncRewardScorer
from omni_rl.reward.manager import RewardManager, RewardSpec
from omni_rl.utils.atomic import atomic_write_json

WORDS = ["hello", "omni", "reward", "batch", "flow", "policy", "sample", "score"]


def text_images(n: int) -> tuple[list[Image.Image], list[str]]:
    font = ImageFont.load_default(size=36)
    images, prompts = [], []
    for i in range(n):
        word = WORDS[i % len(WORDS)]
        image = Image.new("RGB", (256, 64), "white")
        ImageDraw.Draw(image).text((12, 10), word, fill="black", font=font)
        images.append(image)
        prompts.append(f'a sign that says "{word}"')
    return images, prompts


def random_images(n: int) -> tuple[torch.Tensor, list[str]]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 64, 64, 3), dtype=torch.uint8, generator=g), [f"a photo of {w}" for w in WORDS] * (n // len(WORDS) + 1)


def one_at_a_time(manager: RewardManager, samples, prompts) -> float:
    start = time.perf_counter()
    for i in range(len(prompts)):
        sample = samples[i : i + 1] if isinstance(samples, torch.Tensor) else [samples[i]]
        manager.score(sample, [prompts[i]], [{}])
    return time.perf_counter() - start


def micro_batched(manager: RewardManager, samples, prompts, max_batch_size: int, max_wait_ms: float) -> float:
    scorer = AsyncRewardScorer(manager, max_batch_size, max_wait_ms)
    try:
        start = time.perf_counter()
        futures = [scorer.submit(samples[i], prompts[i], {}) for i in range(len(prompts))]
        scorer.gather(futures, timeout_s=600)
        return time.perf_counter() - start
    finally:
        scorer.close()


def measure(name: str, manager: RewardManager, samples, prompts, args) -> dict:
    n = len(prompts)
    one_at_a_time(manager, samples, prompts[: min(n, 4)])  # warm-up (lazy init, first calls)
    arms = {"one_at_a_time": [], "micro_batched": []}
    for _ in range(args.repeats):
        arms["one_at_a_time"].append(one_at_a_time(manager, samples, prompts))
        arms["micro_batched"].append(micro_batched(manager, samples, prompts, args.max_batch_size, args.max_wait_ms))
    per_s = {arm: n / statistics.median(times) for arm, times in arms.items()}
    return {
        "samples": n,
        "samples_per_s": per_s,
        "speedup": per_s["micro_batched"] / per_s["one_at_a_time"],
        "wall_s": arms,
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/reward_batching.json")
    p.add_argument("--num-samples", type=int, default=64)
    p.add_argument("--ocr-samples", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--max-wait-ms", type=float, default=20.0)
    args = p.parse_args(argv)
    from rewards.tiny_models import build_tiny_clip

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_clip(Path(tmp) / "clip")
        manager = RewardManager([RewardSpec("clip_score", kwargs={"model": str(Path(tmp) / "clip"), "device": "cpu"})])
        images, prompts = random_images(args.num_samples)
        results["clip_score_tiny"] = measure("clip_score", manager, images, prompts[: args.num_samples], args)
    try:
        ocr_manager = RewardManager([RewardSpec("ocr")])
        images, prompts = text_images(args.ocr_samples)
        results["ocr"] = measure("ocr", ocr_manager, images, prompts, args)
    except ImportError as err:
        results["ocr"] = {"skipped": str(err)}
    report = {
        "benchmark": "reward_batching",
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "torch_version": torch.__version__,
                    "torch_threads": torch.get_num_threads(), "platform": platform.platform()},
        "settings": vars(args),
        "results": results,
    }
    atomic_write_json(args.out, report)
    for name, r in results.items():
        if "samples_per_s" in r:
            s = r["samples_per_s"]
            print(f"{name:16s} one-at-a-time {s['one_at_a_time']:8.1f}/s  micro-batched {s['micro_batched']:8.1f}/s  "
                  f"x{r['speedup']:.2f}")
        else:
            print(f"{name:16s} skipped: {r['skipped']}")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()

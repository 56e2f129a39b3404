"""The README's before/after picture of the demo: a run's validation captions drawn by the
pretrained shape model and by the same model with the run's trained LoRA, side by side, each
tile framed green (the detector accepts it) or red.

    python -m demos.shapes.before_after --run outputs/tiny_sd3_shapes_counting --out docs/demo_before_after.png

Both halves are drawn by diffusers' own `StableDiffusion3Pipeline` (the shipped folder, then
`load_lora_weights(RUN/lora)`: the LoRA export as a diffusers user loads it), with the same
seeds, Euler steps and guidance as the trainer's validation. Rows are the run's
`data.val_prompts` (its config.yaml), or the first `--per-task` captions of each task type of its
`data.val_prompt_file`, `--samples` seeds each.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from demos.shapes.evaluate import ROOT
from demos.shapes.model import MAX_SEQUENCE_LENGTH, WEIGHTS


def run_prompts(run: Path, per_task: int) -> list[str]:
    """The captions `run` validated on (see the module docstring)."""
    from omegaconf import OmegaConf

    data = OmegaConf.load(run / "config.yaml").data
    if data.val_prompts:
        return list(data.val_prompts)
    if not data.val_prompt_file:
        raise SystemExit(f"error: {run / 'config.yaml'} names no data.val_prompts or data.val_prompt_file")
    path = Path(data.val_prompt_file)
    return pick_prompts(path if path.is_absolute() else ROOT / path, per_task)


def pick_prompts(path: Path, per_task: int) -> list[str]:
    chosen: dict[str, list[str]] = defaultdict(list)
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            task = row["metadata"]["geneval"]["task"]
            if len(chosen[task]) < per_task:
                chosen[task].append(row["prompt"])
    return [p for task in sorted(chosen) for p in chosen[task]]


@torch.no_grad()
def draw(pipe, prompts: list[str], samples: int, steps: int, guidance: float, seed: int) -> np.ndarray:
    images = []
    for i, prompt in enumerate(prompts):
        for k in range(samples):
            out = pipe(prompt, height=32, width=32, num_inference_steps=steps, guidance_scale=guidance,
                       max_sequence_length=MAX_SEQUENCE_LENGTH, generator=torch.Generator().manual_seed(seed + 1000 * i + k),
                       output_type="np")
            images.append((out.images[0] * 255).round().astype(np.uint8))
    return np.stack(images)


def scored_grid(images: np.ndarray, prompts: list[str], samples: int):
    from demos.shapes.grammar import parse_caption
    from demos.shapes.reward import checks, detect
    from omni_rl.logging import make_grid

    marks = [all(c == 1.0 for c in checks(parse_caption(prompts[n // samples]), detect(img)))
             for n, img in enumerate(images)]
    captions = [prompts[n // samples] if n % samples == 0 else "" for n in range(len(images))]
    return make_grid(images, nrow=samples, captions=captions, marks=marks, padding=8, min_tile_size=96), float(np.mean(marks))


def main(argv: Optional[list[str]] = None) -> int:
    from diffusers import StableDiffusion3Pipeline
    from PIL import Image, ImageDraw

    from omni_rl.utils.atomic import atomic_save_image

    parser = argparse.ArgumentParser(prog="python -m demos.shapes.before_after", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a finished run's output folder (with lora/)")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--per-task", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--guidance-scale", type=float, default=4.5)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    lora = Path(args.run) / "lora"
    if not (lora / "pytorch_lora_weights.safetensors").is_file():
        raise SystemExit(f"error: {lora} has no pytorch_lora_weights.safetensors; give a finished LoRA run's folder")
    prompts = run_prompts(Path(args.run), args.per_task)
    pipe = StableDiffusion3Pipeline.from_pretrained(WEIGHTS, text_encoder_3=None, tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    halves = []
    for label in ("before RL (the pretrained model)", "after RL (its trained LoRA)"):
        if label.startswith("after"):
            pipe.load_lora_weights(str(lora))
        grid, accuracy = scored_grid(draw(pipe, prompts, args.samples, args.steps, args.guidance_scale, args.seed),
                                     prompts, args.samples)
        halves.append((f"{label}: {accuracy:.0%} right", grid))
    width = sum(g.width for _, g in halves) + 16
    height = max(g.height for _, g in halves) + 24
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    x = 0
    for title, grid in halves:
        ImageDraw.Draw(canvas).text((x + 8, 6), title, fill=(0, 0, 0))
        canvas.paste(grid, (x, 24))
        x += grid.width + 16
    atomic_save_image(canvas, Path(args.out))
    print(f"wrote {args.out}: " + "; ".join(t for t, _ in halves))
    return 0


if __name__ == "__main__":
    sys.exit(main())

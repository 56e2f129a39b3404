"""How well a shape model draws: GenEval-style accuracy of deterministic samples, per task.

    python -m demos.shapes.evaluate --model-path tiny:sd3_shapes --out benchmarks/results/sd3_shapes_pretrained.json

For each prompt of a split (`recipes/prompts/geneval_shapes_heldout.jsonl` by default) it draws
`--samples` images with ODE sampling (noise 0) from fixed seeds, as the trainer's validation
does, and scores them with `geneval_shapes`' detector. Besides the accuracy (overall and per
task type, with its standard error) it reports the two numbers the issue asks of a pretrained
model before any RL: the share of samples in which the detector finds the prompted number of
objects, and the share in which it finds at least one object of a known shape. The same
function (`evaluate`) backs the test that the shipped weights meet those bars.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "recipes" / "prompts" / "geneval_shapes_heldout.jsonl"


def read_prompts(path: Path) -> list[str]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [row["prompt"] for row in rows]


def _objects_asked(spec) -> int:
    return sum(o.count for o in spec.objects)


def evaluate(model, prompts: list[str], samples: int = 4, num_steps: int = 12, guidance_scale: float = 4.5,
             size: int = 32, seed: int = 1234, max_num_seqs: int = 64) -> dict:
    """Accuracy of `model` (a loaded SD3 adapter) on `prompts`, `samples` ODE images each."""
    from demos.shapes.grammar import parse_caption
    from demos.shapes.reward import checks, detect
    from omni_rl.rollout.native import NativeDiffusionEngine
    from omni_rl.rollout.types import DiffusionRequest

    requests = [
        DiffusionRequest(prompt=p, seed=seed + 1000 * i + k, height=size, width=size, num_steps=num_steps,
                         guidance_scale=guidance_scale, kernel="ode", noise_level=0.0)
        for i, p in enumerate(prompts) for k in range(samples)
    ]
    engine = NativeDiffusionEngine(model, max_num_seqs=max_num_seqs)
    try:
        results = engine.generate(requests)
    finally:
        engine.close()
    by_task: dict[str, list[float]] = defaultdict(list)
    counted = some = 0
    for request, result in zip(requests, results):
        spec = parse_caption(request.prompt)
        found = detect(result.image.numpy())  # uint8 [H, W, 3]
        shaped = [d for d in found if d.shape is not None]
        counted += len(shaped) == _objects_asked(spec)
        some += len(shaped) >= 1
        by_task[spec.task].append(float(all(c == 1.0 for c in checks(spec, found))))
    scores = [s for task in by_task.values() for s in task]
    return {
        "num_prompts": len(prompts), "samples_per_prompt": samples, "num_steps": num_steps,
        "guidance_scale": guidance_scale, "seed": seed,
        "accuracy": _mean_se(scores),
        "per_task": {task: _mean_se(v) for task, v in sorted(by_task.items())},
        "prompted_count_found": counted / len(requests),
        "some_object_found": some / len(requests),
    }


def _mean_se(values: list[float]) -> dict:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / max(n - 1, 1)
    return {"mean": mean, "se": math.sqrt(var / n), "n": n}


def main(argv: Optional[list[str]] = None) -> int:
    from demos.shapes.model import MAX_SEQUENCE_LENGTH
    from omni_rl.config.schema import ModelConfig
    from omni_rl.models.diffusion import PromptLengthOptions
    from omni_rl.models import build_model
    from omni_rl.plugins import load_plugins
    from omni_rl.utils.atomic import atomic_write_json

    parser = argparse.ArgumentParser(prog="python -m demos.shapes.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="tiny:sd3_shapes")
    parser.add_argument("--prompts", default=str(HELDOUT), help="a JSONL prompt file (rows with 'prompt')")
    parser.add_argument("--samples", type=int, default=4, help="images per prompt")
    parser.add_argument("--num-steps", type=int, default=12)
    parser.add_argument("--guidance-scale", type=float, default=4.5)
    parser.add_argument("--out", help="write the result here as JSON")
    args = parser.parse_args(argv)
    load_plugins()
    model = build_model(ModelConfig(path=args.model_path, adapter_options=PromptLengthOptions(max_sequence_length=MAX_SEQUENCE_LENGTH)), torch.device("cpu"))
    result = evaluate(model, read_prompts(Path(args.prompts)), args.samples, args.num_steps, args.guidance_scale)
    result = {"model_path": args.model_path, "prompts": Path(args.prompts).name, **result}
    print(json.dumps(result, indent=1))
    if args.out:
        atomic_write_json(Path(args.out), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

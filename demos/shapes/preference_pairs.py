"""Preference pairs of shape scenes for offline Diffusion-DPO: a right scene over a near miss.

For a caption of the grammar, the chosen image is a scene that holds what it asks (`layout`) and
the rejected one a scene of a near miss (`near_miss`): one thing the caption checks made wrong,
the mistakes the pretrained shape model makes:

| task          | the near miss                                   |
|---------------|-------------------------------------------------|
| counting      | one shape more or fewer (within 1..4)            |
| colors        | another colour                                  |
| single_object | another shape                                   |
| two_object    | the second object's shape changed to a third one |
| color_attr    | the two colours swapped                         |
| position      | the opposite relation                           |

Both are rendered by the dataset's own drawing code (`render`), so the pairs are exact: the
detector (`demos.shapes.reward`) scores every chosen image 1 and every rejected one 0.

    python -m demos.shapes.preference_pairs --out DIR --captions "three red circles" ...
    python -m demos.shapes.preference_pairs --out DIR --prompt-file recipes/prompts/geneval_shapes_train.jsonl

writes DIR/pairs.jsonl (`omni_rl.data.preference_file`'s rows) and DIR/images/*.png,
deterministically in `--seed`.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from demos.shapes.grammar import MAX_COUNT, RELATIONS, ObjectSpec, SceneSpec, caption_of, parse_caption
from demos.shapes.sampling import layout
from demos.shapes.scene import COLOURS, SHAPES, render

OPPOSITE = {"left_of": "right_of", "right_of": "left_of", "above": "below", "below": "above"}
assert set(OPPOSITE) == set(RELATIONS)


def near_miss(spec: SceneSpec, rng: np.random.Generator) -> SceneSpec:
    """A spec that differs from `spec` in one thing its caption checks (the module's table)."""
    objects, task = list(spec.objects), spec.task
    if task == "position":
        return replace(spec, relation=OPPOSITE[spec.relation])
    if task == "color_attr":
        a, b = objects
        return SceneSpec((replace(a, colour=b.colour), replace(b, colour=a.colour)))
    if task == "counting":
        only = objects[0]
        counts = [n for n in (only.count - 1, only.count + 1) if 1 <= n <= MAX_COUNT]
        return SceneSpec((replace(only, count=int(rng.choice(counts))),))
    if task == "colors":
        only = objects[0]
        return SceneSpec((replace(only, colour=str(rng.choice([c for c in COLOURS if c != only.colour]))),))
    if task == "single_object":
        return SceneSpec((ObjectSpec(str(rng.choice([s for s in SHAPES if s != objects[0].shape]))),))
    # two_object: the second shape becomes the third one (the two stay different shapes)
    third = next(s for s in SHAPES if s not in (objects[0].shape, objects[1].shape))
    return SceneSpec((objects[0], replace(objects[1], shape=third)))


def write_pairs(captions: list[str], per_caption: int, size: int, seed: int, out: Path) -> Path:
    """`per_caption` pairs of each caption into `out`; returns the pairs file."""
    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = []
    for c, caption in enumerate(captions):
        spec = parse_caption(caption)
        for k in range(per_caption):
            names = {}
            for field, which in (("chosen", spec), ("rejected", near_miss(spec, rng))):
                name = f"{c:03d}_{k:03d}_{field}.png"
                Image.fromarray(render(layout(which, rng), size)).save(images / name)
                names[field] = f"images/{name}"
            rows.append({"prompt": caption_of(spec), **names})
    path = out / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the folder to write pairs.jsonl and images/ into")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--captions", nargs="+", help="captions of the grammar")
    source.add_argument("--prompt-file", help="a JSONL prompt file (its rows' prompt fields)")
    p.add_argument("--per-caption", type=int, default=16)
    p.add_argument("--size", type=int, default=32, help="image side in pixels")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.prompt_file:
        lines = Path(args.prompt_file).read_text(encoding="utf-8").splitlines()
        captions = [json.loads(line)["prompt"] for line in lines if line.strip()]
    else:
        captions = args.captions
    path = write_pairs(captions, args.per_caption, args.size, args.seed, Path(args.out))
    print(f"wrote {len(captions) * args.per_caption} pairs to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

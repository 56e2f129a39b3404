"""Writes the GenEval-style shape prompt sets: `recipes/prompts/geneval_shapes_train.jsonl` and
`recipes/prompts/geneval_shapes_heldout.jsonl`.

    python -m demos.shapes.prompt_files      # from the repository root; rewrites both

The captions are those of `demos.shapes.sampling.prompt_splits(SEED)`: per GenEval task
type (single_object 3 captions, colors 12, counting 45, two_object 6, color_attr 72, position
312 of which 80 are kept), a fifth (at least one) held out, the rest for training; no caption
is in both files. Each row is `{"prompt": caption, "metadata": {"geneval": spec}}` with the spec
of `SceneSpec.to_dict()` (its task type, objects and relation), which the `geneval_shapes`
reward reads instead of parsing the prompt. Deterministic: the same SEED writes the same bytes.
"""
from __future__ import annotations

import json
from pathlib import Path

from demos.shapes.grammar import caption_of
from demos.shapes.sampling import prompt_splits

PROMPTS = Path(__file__).resolve().parents[2] / "recipes" / "prompts"  # the recipes' folder, in the checkout
SEED = 0
FILES = {"train": PROMPTS / "geneval_shapes_train.jsonl", "heldout": PROMPTS / "geneval_shapes_heldout.jsonl"}


def rows(split: str) -> list[str]:
    """The JSONL lines of `split` ("train" or "heldout")."""
    train, heldout = prompt_splits(SEED)
    specs = {"train": train, "heldout": heldout}[split]
    return [json.dumps({"prompt": caption_of(s), "metadata": {"geneval": s.to_dict()}}) for s in specs]


def main() -> None:
    for split, path in FILES.items():
        lines = rows(split)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"wrote {len(lines)} prompts to {path}")


if __name__ == "__main__":
    main()

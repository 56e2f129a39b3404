"""The GenEval-style shape demo in one package: scenes, captions, the detector reward, the
pretrained model and the scripts that made and measure it.

A plugin: it imports `omni_rl`, never the reverse. Importing it registers its components,
which the `omni_rl.plugins` entry point `shapes = demos.shapes` (pyproject.toml) does for every run:
the reward `geneval_shapes` (`reward`), the benchmarks `geneval_shapes` and `shapes_counting` (`benchmark`), the packaged model `tiny:sd3_shapes` (`model`: the
shipped `weights/` with their `SHA256SUMS`, loaded through the SD3 adapter) and its prompt writer `tiny:qwen3_shape_words` (`writer`).

| module             | what                                                                   |
|--------------------|------------------------------------------------------------------------|
| `scene`            | `Shape`, `Scene`, `render(scene, size)`: flat shapes on grey, no anti-aliasing |
| `grammar`          | GenEval's six task types as captions: `parse_caption`, `caption_of`, `SceneSpec` |
| `sampling`         | matching (caption, scene) pairs from a seed, the train / held-out caption splits |
| `reward`           | `geneval_shapes`: a detector without weights checks an image against its caption |
| `geneval`          | the same detector feeding GenEval's own rules: `geneval_row(spec)`, `shape_verdict(image, spec)` |
| `model`            | `tiny:sd3_shapes` and the text length every user of it gives            |
| `writer`           | `tiny:qwen3_shape_words`: a tiny Qwen3 writer with the grammar's words as tokens |
| `pretrain`         | `python -m demos.shapes.pretrain --out DIR`: the model from nothing      |
| `evaluate`         | `python -m demos.shapes.evaluate`: its accuracy per task before RL       |
| `benchmark`        | the `--eval` benchmarks `geneval_shapes` and `shapes_counting`          |
| `before_after`     | `python -m demos.shapes.before_after`: the README's before/after picture |
| `preference_pairs` | `python -m demos.shapes.preference_pairs`: right scenes over near misses |
| `prompt_files`     | `python -m demos.shapes.prompt_files`: writes `recipes/prompts/geneval_shapes_*.jsonl` |

The recipes (`recipes/tiny_sd3_shapes_*.yaml`) and the files they read (the prompt sets in
`recipes/prompts/`, the pairs in `recipes/preference_pairs/shapes_counting/`) stay in `recipes/`.
"""
from demos.shapes import benchmark, model, reward, writer  # noqa: F401  (imported to register)
from demos.shapes.grammar import (
    RELATIONS,
    TASKS,
    CaptionError,
    ObjectSpec,
    SceneSpec,
    caption_of,
    parse_caption,
)
from demos.shapes.sampling import LAYOUT, ScenePair, all_specs, layout, prompt_splits, sample_pair
from demos.shapes.scene import BACKGROUND, COLOURS, DEFAULT_SIZE, SHAPES, Scene, Shape, render, shape_mask

__all__ = [
    "BACKGROUND", "COLOURS", "DEFAULT_SIZE", "LAYOUT", "RELATIONS", "SHAPES", "TASKS",
    "CaptionError", "ObjectSpec", "Scene", "ScenePair", "SceneSpec", "Shape",
    "all_specs", "caption_of", "layout", "parse_caption", "prompt_splits", "render", "sample_pair", "shape_mask",
]

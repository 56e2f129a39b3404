"""Synthetic shape scenes for a GenEval-style demo: a renderer, a caption grammar, matching pairs.

- `scene`: `Shape`, `Scene`, `render(scene, size)`: one to four flat circles, squares and
  triangles in four colours on light grey, drawn without anti-aliasing at any size.
- `grammar`: GenEval's six task types as captions (`parse_caption`, `caption_of`, `SceneSpec`).
- `sampling`: matching (caption, scene) pairs from a seed (`sample_pair`, `layout`), and the
  train / held-out caption splits written to `recipes/prompts/geneval_shapes_*.jsonl`.

The reward that scores images against these captions is `rewards/geneval_shapes.py` (a plugin:
it imports this package; nothing here knows it). A pretraining script draws `sample_pair(i)`
for i = 0, 1, ... and renders each scene.
"""
from omni_rl.data.shapes.grammar import (
    RELATIONS,
    TASKS,
    CaptionError,
    ObjectSpec,
    SceneSpec,
    caption_of,
    parse_caption,
)
from omni_rl.data.shapes.sampling import LAYOUT, ScenePair, all_specs, layout, prompt_splits, sample_pair
from omni_rl.data.shapes.scene import BACKGROUND, COLOURS, DEFAULT_SIZE, SHAPES, Scene, Shape, render, shape_mask

__all__ = [
    "BACKGROUND", "COLOURS", "DEFAULT_SIZE", "LAYOUT", "RELATIONS", "SHAPES", "TASKS",
    "CaptionError", "ObjectSpec", "Scene", "ScenePair", "SceneSpec", "Shape",
    "all_specs", "caption_of", "layout", "parse_caption", "prompt_splits", "render", "sample_pair", "shape_mask",
]

"""The tiny SD3 that draws shapes, pretrained by omni-rl (`demos/shapes/pretrain.py`).

Its weights ship in `weights/` (a `StableDiffusion3Pipeline` folder without T5, ~7 MB, with
`SHA256SUMS`); `model.path=tiny:sd3_shapes` loads them through the SD3 adapter after checking
every file. `evaluate.py` measures how well it draws (GenEval-style accuracy per task).
"""
from pathlib import Path

from omni_rl.models.registry import register_packaged_model

WEIGHTS = Path(__file__).resolve().parent / "weights"
# The model has no T5: this many zero tokens stand in for it after the CLIP tokens, as in its
# pretraining. They pass through the context embedder and join the attention, so any other
# number is another input: every user of the model (recipe, evaluation, tests) gives this one.
MAX_SEQUENCE_LENGTH = 8
register_packaged_model("sd3_shapes", WEIGHTS)

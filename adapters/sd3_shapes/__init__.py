"""The tiny SD3 that draws shapes, pretrained by omni-rl (`adapters/sd3_shapes/pretrain.py`).

Its weights ship in `weights/` (a `StableDiffusion3Pipeline` folder without T5, ~7 MB, with
`SHA256SUMS`); `model.path=tiny:sd3_shapes` loads them through the SD3 adapter after checking
every file. `evaluate.py` measures how well it draws (GenEval-style accuracy per task).
"""
from pathlib import Path

from omni_rl.models.registry import register_packaged_model

WEIGHTS = Path(__file__).resolve().parent / "weights"
register_packaged_model("sd3_shapes", WEIGHTS)

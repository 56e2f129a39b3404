"""Model families: what the PPO loop does that depends on the kind of model (see `base.py`).

`MODEL_FAMILIES` maps an adapter's `family` to its `ModelFamily`: `diffusion` (denoising steps
are the actions) and `autoregressive` (tokens are). Importing this package registers both;
`update.run_update` is the PPO update loop every actor group runs over a family.
"""
from omni_rl.families.base import MODEL_FAMILIES, BehaviourPolicy, ModelFamily, build_family, register_family
from omni_rl.families.autoregressive import TextFamily
from omni_rl.families.diffusion import DiffusionFamily

__all__ = [
    "MODEL_FAMILIES", "BehaviourPolicy", "DiffusionFamily", "ModelFamily", "TextFamily", "build_family",
    "register_family",
]

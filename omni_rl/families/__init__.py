"""Model families: what the PPO loop does that depends on the kind of model (see `base.py`).

`MODEL_FAMILIES` maps an adapter's `family` to its `ModelFamily`: `diffusion` (denoising steps
are the actions), `autoregressive` (tokens are) and `think_draw` (a plan's tokens, then the
denoising steps of the image drawn from it, in one trajectory) and `talker` (an omni model's spoken
answer: speech frames of K codec tokens, after the answer's tokens when the thinker trains too); `forward_process` is the diffusion
family's variant for DiffusionNFT / Diffusion-DPO (`ModelFamily.variant` picks it by the loss).
Importing this package registers them; `update.run_update` is the PPO update loop every actor
group runs over a family.
"""
from omni_rl.families.base import MODEL_FAMILIES, BehaviourPolicy, ModelFamily, build_family, register_family
from omni_rl.families.autoregressive import TextFamily
from omni_rl.families.diffusion import DiffusionFamily
from omni_rl.families.forward_process import ForwardProcessFamily
from omni_rl.families.think_draw import ThinkDrawFamily
from omni_rl.families.talker import TalkerFamily

__all__ = [
    "MODEL_FAMILIES", "BehaviourPolicy", "DiffusionFamily", "ForwardProcessFamily", "ModelFamily", "TextFamily",
    "TalkerFamily", "ThinkDrawFamily", "build_family", "register_family",
]

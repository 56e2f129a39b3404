"""Model families: what the PPO loop does that depends on the kind of model (see `base.py`).

`MODEL_FAMILIES` maps an adapter's `family` to its `ModelFamily`: `diffusion`, `autoregressive`,
`think_draw` and `talker`; `agent` is the autoregressive family's variant for multi-turn
trajectories with tools (an `agent:` block); `forward_process` is the diffusion family's variant for DiffusionNFT
/ Diffusion-DPO. Importing this package registers them; `update.run_update` is the update loop.
"""
from omni_rl.families.base import MODEL_FAMILIES, BehaviourPolicy, ModelFamily, build_family, register_family
from omni_rl.families.autoregressive import TextFamily
from omni_rl.families.agent import AgentFamily
from omni_rl.families.diffusion import DiffusionFamily
from omni_rl.families.forward_process import ForwardProcessFamily
from omni_rl.families.think_draw import ThinkDrawFamily
from omni_rl.families.talker import TalkerFamily

__all__ = [
    "MODEL_FAMILIES", "AgentFamily", "BehaviourPolicy", "DiffusionFamily", "ForwardProcessFamily", "ModelFamily", "TextFamily",
    "TalkerFamily", "ThinkDrawFamily", "build_family", "register_family",
]

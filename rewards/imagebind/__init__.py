"""ImageBind (Girdhar et al. 2023) as a reward: `model.py` (the network, with Meta's key names),
`data.py` (its input pipeline in torch) and `reward.py` (the `imagebind` reward). The PyPI
`imagebind` package is an empty placeholder, hence the architecture here; the released weights
are CC-BY-NC-SA 4.0 (non-commercial), never downloaded: `checkpoint=` names a local file.
"""
from rewards.imagebind.model import ImageBindConfig, ImageBindModel, build_model, load_checkpoint, read_state_dict
from rewards.imagebind.reward import MODES, ImageBindScorer

__all__ = [
    "MODES", "ImageBindConfig", "ImageBindModel", "ImageBindScorer",
    "build_model", "load_checkpoint", "read_state_dict",
]

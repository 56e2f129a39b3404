"""ImageBind (Girdhar et al. 2023, "ImageBind: One Embedding Space To Bind Them All") as a reward.

- `model.py`: the network for vision, text and audio, with parameter names matching Meta's
  `imagebind_huge.pth`, and strict checkpoint loading.
- `data.py`: ImageBind's input pipeline in torch (Kaldi-style 128-bin log-mel at 16 kHz, 2-frame
  video clips in three crops, CLIP BPE ids).
- `reward.py`: the `imagebind` reward (modes `text_audio`, `text_video`, `audio_video`, `all`).

The PyPI package named `imagebind` is an empty placeholder, so the architecture is written here.
The released weights (`imagebind_huge.pth`) are licensed CC-BY-NC-SA 4.0: non-commercial use
only; this code does not download them, a local `checkpoint=` path is required.
"""
from rewards.imagebind.model import ImageBindConfig, ImageBindModel, build_model, load_checkpoint, read_state_dict
from rewards.imagebind.reward import MODES, ImageBindScorer

__all__ = [
    "MODES", "ImageBindConfig", "ImageBindModel", "ImageBindScorer",
    "build_model", "load_checkpoint", "read_state_dict",
]

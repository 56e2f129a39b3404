"""PickScore (Kirstain et al. 2023, "Pick-a-Pic"): a CLIP ViT-H/14 fine-tuned on human
preferences between generated images.

    reward = scale * exp(logit_scale) * cos(text_embedding(prompt), image_embedding(image))

With the released model exp(logit_scale) is 100, so raw PickScores of SD-class images lie around
18..24 and the default `scale` 1/26 (Flow-GRPO's) gives ~0.7..0.9. Options: `model`
(`yuvalkirstain/PickScore_v1`), `processor` (`laion/CLIP-ViT-H-14-laion2B-s32B-b79K`, configs
only), `scale`, `device`.
"""
from __future__ import annotations

from typing import Any, Sequence

from omni_rl.reward import Images, check_batch, register_reward
from rewards.clip_embedder import ClipEmbedder, check_scale
from rewards.pretrained import device_network

DEFAULT_MODEL = "yuvalkirstain/PickScore_v1"
DEFAULT_PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"


class PickScoreScorer:
    def __init__(self, model: str, processor: str, scale: float, device: str):
        self.scale = check_scale("pickscore", scale)
        self.clip = ClipEmbedder("pickscore", model, processor, device)
        self.logit_scale = self.clip.logit_scale()

    def __call__(self, images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(images, prompts, metadata)
        cosine = (self.clip.images(images) * self.clip.texts(prompts)).sum(dim=-1)
        return (self.scale * self.logit_scale * cosine).cpu().tolist()


@register_reward("pickscore", device_networks=device_network("CLIPModel", "model", DEFAULT_MODEL, "pickscore"))
def pickscore(
    *, model: str = DEFAULT_MODEL, processor: str = DEFAULT_PROCESSOR, scale: float = 1.0 / 26.0, device: str = "auto",
) -> PickScoreScorer:
    """PickScore of each image for its prompt, times `scale` (1/26 by default)."""
    return PickScoreScorer(model, processor, scale, device)

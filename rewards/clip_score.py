"""CLIP score: the cosine similarity of CLIP's image and prompt embeddings.

    clip_score = scale * cos(text_embedding(prompt), image_embedding(image))

With `scale` 1 (default) scores lie in [-1, 1], ~0.15..0.40 for matching pairs; `scale=100` gives
torchmetrics' `CLIPScore` without its clamp at 0 (Hessel et al.'s is 2.5 max(cos, 0)). Prompts are
padded to 77 tokens (`rewards.clip_embedder`), so a score does not depend on its batch. Options:
`model` (`openai/clip-vit-large-patch14`; `tiny:clip-reward` for tests), `processor`, `scale`,
`device`.
"""
from __future__ import annotations

from typing import Any, Sequence

from omni_rl.reward import Images, check_batch, register_reward
from rewards.clip_embedder import DEFAULT_CLIP, ClipEmbedder, check_scale
from rewards.pretrained import device_network


class ClipScorer:
    """`scale * cos(text, image)` per sample."""

    def __init__(self, model: str, processor: str | None, scale: float, device: str):
        self.scale = check_scale("clip_score", scale)
        self.clip = ClipEmbedder("clip_score", model, processor, device)

    def __call__(self, images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(images, prompts, metadata)
        cosine = (self.clip.images(images) * self.clip.texts(prompts)).sum(dim=-1)
        return (self.scale * cosine).cpu().tolist()


@register_reward("clip_score", device_networks=device_network("CLIPModel", "model", DEFAULT_CLIP, "clip_score"))
def clip_score(
    *, model: str = DEFAULT_CLIP, processor: str | None = None, scale: float = 1.0, device: str = "auto",
) -> ClipScorer:
    """`scale` times the CLIP cosine similarity of each image with its prompt."""
    return ClipScorer(model, processor, scale, device)

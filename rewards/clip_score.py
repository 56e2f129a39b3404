"""CLIP score: the cosine similarity of CLIP's image and prompt embeddings.

    clip_score = scale * cos(text_embedding(prompt), image_embedding(image))

`scale` defaults to 1, so scores lie in [-1, 1] (in practice ~0.15..0.40 for matching pairs).
`scale=100` gives the numbers torchmetrics' `CLIPScore` reports, except that torchmetrics also
clamps negative values to 0; no clamp is applied here, so a reward keeps its gradient of
preference below 0. Hessel et al.'s CLIPScore is `2.5 * max(cos, 0)`.

Options:
    model      a transformers `CLIPModel`: hub id or local folder (default
               `openai/clip-vit-large-patch14`); `tiny:clip-reward` is a tiny random one.
    processor  where to load the `CLIPProcessor` (tokenizer + image processor) from; default:
               the same place as `model`.
    scale      multiplies the cosine (default 1.0).
    device     `auto` (cuda, else npu, else cpu; see `omni_rl.device.pick_device`) or a name.

The whole batch goes through the model at once (`rewards.clip_embedder`, shared with
`pickscore` and `aesthetic`): images are resized and cropped by the processor, prompts are
padded to the model's full context (77 tokens) so a prompt's embedding does not depend on the
other prompts in its batch, and truncated there. The model runs in fp32, in eval mode, without
gradients.

Extra: transformers (a core dependency); the weights are downloaded from the hub on first use,
or read from a local folder.
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

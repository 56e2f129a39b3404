"""CLIP score: the cosine similarity of CLIP's image and prompt embeddings, and the CLIP loading
shared by the CLIP-based rewards (`pickscore`, `aesthetic`).

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

The whole batch goes through the model at once: images are resized and cropped by the
processor, prompts are padded to the model's full context (77 tokens) so a prompt's embedding
does not depend on the other prompts in its batch, and truncated there. The model runs in
fp32, in eval mode, without gradients.

Extra: transformers (a core dependency); the weights are downloaded from the hub on first use,
or read from a local folder.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import torch

from omni_rl.device import pick_device
from omni_rl.reward import Images, check_batch, register_reward, to_pil_list
from rewards.pretrained import load_pretrained

DEFAULT_CLIP = "openai/clip-vit-large-patch14"


def check_scale(reward: str, scale: Any) -> float:
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale == 0:
        raise ValueError(f"{reward}: scale={scale!r}; expected a finite non-zero number")
    return float(scale)


class ClipEmbedder:
    """A transformers CLIP model + processor that turns images and prompts into unit vectors."""

    def __init__(self, reward: str, model: str, processor: str | None, device: str):
        from transformers import CLIPModel, CLIPProcessor

        self.device = pick_device(device)
        self.model = load_pretrained(CLIPModel, model, "model", reward).to(self.device).eval()
        self.processor = load_pretrained(CLIPProcessor, processor or model, "processor", reward)
        tokenizer = self.processor.tokenizer
        # Pad every prompt to the full context: with CLIP's causal text encoder the embedding
        # would not change anyway, but fixed shapes keep batched and single calls identical.
        self.max_length = min(tokenizer.model_max_length, self.model.config.text_config.max_position_embeddings)

    @property
    def dim(self) -> int:
        return int(self.model.config.projection_dim)

    @torch.no_grad()
    def images(self, images: Images) -> torch.Tensor:
        """Unit-norm image embeddings, float32 [B, D], on `self.device`."""
        pixels = self.processor.image_processor(images=to_pil_list(images), return_tensors="pt")["pixel_values"]
        pooled = self.model.vision_model(pixel_values=pixels.to(self.device)).pooler_output
        return torch.nn.functional.normalize(self.model.visual_projection(pooled).float(), dim=-1)

    @torch.no_grad()
    def texts(self, prompts: Sequence[str]) -> torch.Tensor:
        """Unit-norm prompt embeddings, float32 [B, D], on `self.device`."""
        tokens = self.processor.tokenizer(
            list(prompts), padding="max_length", truncation=True, max_length=self.max_length, return_tensors="pt",
        )
        pooled = self.model.text_model(
            input_ids=tokens["input_ids"].to(self.device), attention_mask=tokens["attention_mask"].to(self.device),
        ).pooler_output
        return torch.nn.functional.normalize(self.model.text_projection(pooled).float(), dim=-1)

    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().exp())


class ClipScorer:
    """`scale * cos(text, image)` per sample."""

    def __init__(self, model: str, processor: str | None, scale: float, device: str):
        self.scale = check_scale("clip_score", scale)
        self.clip = ClipEmbedder("clip_score", model, processor, device)

    def __call__(self, images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(images, prompts, metadata)
        cosine = (self.clip.images(images) * self.clip.texts(prompts)).sum(dim=-1)
        return (self.scale * cosine).cpu().tolist()


@register_reward("clip_score")
def clip_score(
    *, model: str = DEFAULT_CLIP, processor: str | None = None, scale: float = 1.0, device: str = "auto",
) -> ClipScorer:
    """`scale` times the CLIP cosine similarity of each image with its prompt."""
    return ClipScorer(model, processor, scale, device)

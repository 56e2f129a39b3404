"""The CLIP towers shared by the CLIP-based rewards (`clip_score`, `pickscore`, `aesthetic`).

`ClipEmbedder(reward, model, processor, device)` loads a `CLIPModel` and `CLIPProcessor` and gives
L2-normalised float32 embeddings: `images(images)` and `texts(prompts)` (padded to the full text
context, so an embedding does not depend on its batch), with `logit_scale()` and `dim`; fp32,
eval mode, no gradients. `check_scale` checks a reward's `scale` option.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import torch

from omni_rl.device import pick_device
from omni_rl.reward import Images, to_pil_list
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

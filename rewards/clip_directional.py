"""`clip_directional`: CLIP directional similarity of an image edit (Gal et al. 2021, StyleGAN-NADA;
the edit metric of InstructPix2Pix, Brooks et al. 2023).

    clip_directional = scale * cos(E_img(edit) - E_img(source), E_txt(target_text) - E_txt(source_text))

with E the unit-norm CLIP embeddings (`rewards.clip_embedder`). Per sample it reads
`metadata["source_image"]` (required: an edit dataset), `target_text` (else the instruction) and
`source_text` (else ""); `require_captions=True` refuses the fallbacks, equal texts raise, and an
unchanged image scores 0. Each distinct source and caption is embedded once. Options: `model`
(`openai/clip-vit-large-patch14`), `processor`, `scale` (1.0), `device`, `batch_size` (32),
`require_captions`.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Hashable, Sequence

import torch

from omni_rl.reward import Images, RewardInputError, check_batch, register_reward, to_pil_list
from rewards.clip_embedder import DEFAULT_CLIP, ClipEmbedder, check_scale
from rewards.pretrained import device_network
from rewards.edit_inputs import check_source_image, source_images

NAME = "clip_directional"


def edit_texts(prompts: Sequence[str], metadata: Sequence[dict[str, Any]], require_captions: bool) -> tuple[list[str], list[str]]:
    """(target_texts, source_texts), one of each per sample (fallbacks in the module docstring)."""
    targets, origins = [], []
    for i, (prompt, meta) in enumerate(zip(prompts, metadata)):
        target = _caption(meta, "target_text", i, require_captions, fallback=prompt)
        origin = _caption(meta, "source_text", i, require_captions, fallback="")
        if target == origin:
            raise RewardInputError(
                f"{NAME}: sample {i} has the same target and source text ({target!r}), so there is no "
                f"text direction to compare the edit with; give the row a target_text (a caption of "
                f"the wanted result) that differs from its source_text"
            )
        targets.append(target)
        origins.append(origin)
    return targets, origins


def _caption(meta: dict[str, Any], key: str, index: int, required: bool, fallback: str) -> str:
    value = meta.get(key)
    if value is None:
        if required:
            raise RewardInputError(
                f"{NAME}: metadata[{index}] has no {key!r} and require_captions=True; give every row of "
                f"the edit prompt file a target_text and a source_text, or set require_captions=False "
                f"(target_text then falls back to the instruction, source_text to \"\")"
            )
        return fallback
    if not isinstance(value, str):
        raise RewardInputError(f"{NAME}: metadata[{index}][{key!r}] has type {type(value).__name__}; expected str")
    return value


class ClipDirectionalScorer:
    """`scale * cos(E(edit) - E(source), E(target_text) - E(source_text))` per sample."""

    def __init__(self, model: str, processor: str | None, scale: float, device: str, batch_size: int,
                 require_captions: bool):
        _check_options(scale=scale, batch_size=batch_size, require_captions=require_captions)
        self.scale = float(scale)
        self.batch_size = int(batch_size)
        self.require_captions = require_captions
        self.clip = ClipEmbedder(NAME, model, processor, device)

    def __call__(self, images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(images, prompts, metadata)
        sources = source_images(metadata, NAME)
        targets, origins = edit_texts(prompts, metadata, self.require_captions)
        edits = to_pil_list(images)
        image_change = (
            self._embed(edits, list(range(len(edits))), self.clip.images)
            - self._embed(sources, [id(s) for s in sources], self.clip.images)
        )
        text_change = self._embed(targets, targets, self.clip.texts) - self._embed(origins, origins, self.clip.texts)
        cosine = torch.nn.functional.cosine_similarity(image_change, text_change, dim=-1, eps=1e-8)
        return (self.scale * cosine).cpu().tolist()

    def _embed(self, values: Sequence[Any], keys: Sequence[Hashable], embed: Callable[[list], torch.Tensor]) -> torch.Tensor:
        """embed(values) [B, D], computing each distinct key once, `batch_size` at a time."""
        first: dict[Hashable, int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        unique = [values[i] for i in first.values()]
        rows = torch.cat([embed(unique[k : k + self.batch_size]) for k in range(0, len(unique), self.batch_size)])
        slot = {key: j for j, key in enumerate(first)}
        return rows[torch.tensor([slot[key] for key in keys], device=rows.device)]


def _check_options(*, model: str = DEFAULT_CLIP, processor: str | None = None, scale: float = 1.0,
                   device: str = "auto", batch_size: int = 32, require_captions: bool = False) -> None:
    check_scale(NAME, scale)
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}; expected an int >= 1 (images per CLIP forward)")
    if not isinstance(require_captions, bool):
        raise ValueError(f"require_captions={require_captions!r}; expected true or false")


@register_reward(NAME, modalities={"image"}, check_options=_check_options, check_item=check_source_image,
                 device_networks=device_network("CLIPModel", "model", DEFAULT_CLIP, NAME))
def clip_directional(
    *, model: str = DEFAULT_CLIP, processor: str | None = None, scale: float = 1.0, device: str = "auto",
    batch_size: int = 32, require_captions: bool = False,
) -> ClipDirectionalScorer:
    """CLIP directional similarity of each edit with its caption change (see the module docstring)."""
    return ClipDirectionalScorer(model, processor, scale, device, batch_size, require_captions)

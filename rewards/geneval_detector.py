"""GenEval's detector stage: COCO instances from Mask2Former, colours from CLIP, as the rules' objects.

`Mask2FormerDetector` runs transformers' Mask2Former (one forward per group of same-sized
images: the post-processing assumes no padding) and turns its instances into `DetectedObject`s:
class (COCO's 80 things as GenEval names them), score (class probability x mean mask probability,
as mmdet scores them; below `min_score` dropped), mask and the mask's box. `ColourClassifier` is
GenEval's zero-shot colour classifier: per colour, the mean embedding of its three templates for
the class, nearest to the object's crop over flat #999 (`colour_crop`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from PIL import Image

from omni_rl.device import pick_device
from omni_rl.eval.geneval_rules import COCO_CLASSES, COLOURS, DetectedObject
from rewards.clip_embedder import ClipEmbedder
from rewards.pretrained import load_pretrained

DEFAULT_DETECTOR = "facebook/mask2former-swin-small-coco-instance"
BACKGROUND = "#999999"  # GenEval's flat background behind a masked object
TEMPLATES = ("a photo of a {c} {name}", "a photo of a {c}-colored {name}", "a photo of a {c} object")


def mask_box(mask: np.ndarray) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) of a non-empty bool mask [H, W], x1 and y1 exclusive."""
    ys, xs = np.nonzero(mask)
    return (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))


class Mask2FormerDetector:
    """COCO instances of images as `DetectedObject`s (module docstring)."""

    def __init__(self, model: str, processor: str | None, device: str, reward: str, min_score: float):
        from transformers import AutoImageProcessor, Mask2FormerForUniversalSegmentation

        self.device = pick_device(device)
        self.model = load_pretrained(Mask2FormerForUniversalSegmentation, model, "model", reward).to(self.device).eval()
        self.processor = load_pretrained(AutoImageProcessor, processor or model, "processor", reward)
        labels = self.model.config.num_labels
        if labels != len(COCO_CLASSES):
            raise ValueError(
                f"{reward}: model={model!r} predicts {labels} classes; expected a COCO instance-segmentation "
                f"Mask2Former with COCO's {len(COCO_CLASSES)} classes (e.g. {DEFAULT_DETECTOR})"
            )
        self.min_score = float(min_score)

    @torch.no_grad()
    def __call__(self, images: Sequence[Image.Image]) -> list[list[DetectedObject]]:
        found: list[list[DetectedObject]] = [[] for _ in images]
        by_size: dict[tuple[int, int], list[int]] = {}
        for i, image in enumerate(images):
            by_size.setdefault(image.size, []).append(i)
        for (width, height), indices in by_size.items():
            inputs = self.processor(images=[images[i] for i in indices], return_tensors="pt")
            outputs = self.model(**{k: v.to(self.device) for k, v in inputs.items()})
            results = self.processor.post_process_instance_segmentation(
                outputs, threshold=self.min_score, target_sizes=[(height, width)] * len(indices),
                return_binary_maps=True,
            )
            for i, result in zip(indices, results):
                found[i] = self._objects(result)
        return found

    @staticmethod
    def _objects(result: dict) -> list[DetectedObject]:
        segments = result["segments_info"]
        if not segments:
            return []
        masks = result["segmentation"].bool().cpu().numpy()  # [N, H, W], one per segment
        objects = []
        for segment, mask in zip(segments, masks):
            objects.append(DetectedObject(COCO_CLASSES[segment["label_id"]], float(segment["score"]), mask_box(mask),
                                          mask=mask))
        return objects


def colour_crop(image: Image.Image, box: Sequence[float], mask: np.ndarray | None) -> Image.Image:
    """The image through `mask` over flat #999 (no mask: the image), cropped to `box`."""
    image = image.convert("RGB")
    if mask is not None:
        if mask.shape != (image.height, image.width):
            raise ValueError(f"mask of shape {mask.shape}; expected the image's (height, width) = "
                             f"{(image.height, image.width)}")
        flat = Image.new("RGB", image.size, BACKGROUND)
        image = Image.composite(image, flat, Image.fromarray(mask.astype(np.uint8) * 255, mode="L"))
    return image.crop(tuple(int(round(v)) for v in box[:4]))


class ColourClassifier:
    """GenEval's CLIP zero-shot colour of an object's masked crop (module docstring)."""

    def __init__(self, clip: ClipEmbedder):
        self.clip = clip
        self._classes: dict[str, torch.Tensor] = {}

    def class_embeddings(self, name: str) -> torch.Tensor:
        """float32 [10, D], unit rows, in COLOURS order."""
        if name not in self._classes:
            rows = []
            for c in COLOURS:
                templates = self.clip.texts([t.format(c=c, name=name) for t in TEMPLATES])  # [3, D], unit rows
                rows.append(torch.nn.functional.normalize(templates.mean(dim=0), dim=-1))
            self._classes[name] = torch.stack(rows)
        return self._classes[name]

    def __call__(self, image: Image.Image, objects: Sequence[DetectedObject], name: str) -> list[str]:
        """The colour of each object (all of class `name`) in `image`."""
        if not objects:
            return []
        crops = [colour_crop(image, o.box, o.mask) for o in objects]
        similarity = self.clip.images(crops) @ self.class_embeddings(name).T  # [N, 10]
        return [COLOURS[int(k)] for k in similarity.argmax(dim=-1)]

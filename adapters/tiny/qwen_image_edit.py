"""`tiny:qwen_image_edit` is `tiny:qwen_image` plus the Qwen2-VL processor (image patches of 14 px,
merged 2x2) that the edit pipeline loads; `tiny:qwen_image_edit_plus` is the same saved as an
Edit-Plus pipeline, with the transformer's `zero_cond_t` on.
The builders of the adapter in `adapters/qwen_image_edit.py`."""
from __future__ import annotations

from pathlib import Path

from omni_rl.models import register_tiny_model

from adapters.tiny.qwen_image import build_tiny_qwen_image_components


def tiny_processor(tokenizer):
    """Qwen2-VL's processor on the tiny tokenizer: 14 px patches, merged 2x2 (the tiny vision
    tower's), the image processor's default pixel bounds (the processor requires a video
    processor too, which the edit pipeline never calls)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    return Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(patch_size=14, merge_size=2), tokenizer=tokenizer,
                            video_processor=Qwen2VLVideoProcessor(patch_size=14, merge_size=2))


@register_tiny_model("qwen_image_edit")
def build_tiny_qwen_image_edit(folder: Path) -> None:
    """`tiny:qwen_image`'s seeded components (the same weights) and the processor, saved as a
    `QwenImageEditPipeline`."""
    from diffusers import QwenImageEditPipeline

    components = build_tiny_qwen_image_components()
    QwenImageEditPipeline(**components, processor=tiny_processor(components["tokenizer"])).save_pretrained(Path(folder))


@register_tiny_model("qwen_image_edit_plus")
def build_tiny_qwen_image_edit_plus(folder: Path) -> None:
    """`tiny:qwen_image_edit`'s components, saved as a `QwenImageEditPlusPipeline`, with the
    transformer's `zero_cond_t` on (the source images' tokens modulated at timestep 0, an option
    of the Edit-Plus checkpoints), so that the tiny model exercises that path too."""
    from diffusers import QwenImageEditPlusPipeline

    components = build_tiny_qwen_image_components(zero_cond_t=True)
    QwenImageEditPlusPipeline(**components, processor=tiny_processor(components["tokenizer"])).save_pretrained(Path(folder))

"""Model adapters: one module per model family, each registering itself on import."""
from adapters import bagel, bagel_plan, hunyuan_video15, ltx2, qwen3, qwen3_omni, qwen_image, qwen_image_edit, sd3, wan  # noqa: F401

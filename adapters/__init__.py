"""Model adapters: one module per model family, each registering itself on import."""
from adapters import bagel, bagel_plan, ltx2, qwen3, qwen3_omni, qwen3_omni_talker, qwen_image, qwen_image_edit, sd3, wan  # noqa: F401
from adapters import flux, flux_kontext  # noqa: F401
from adapters import z_image  # noqa: F401
from adapters import flux2  # noqa: F401
from adapters import hunyuan_video15  # noqa: F401
from adapters import qwen3_moe  # noqa: F401

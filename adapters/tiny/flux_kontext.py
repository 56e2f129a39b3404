"""`tiny:flux_kontext` is `tiny:flux`'s seeded components saved as a `FluxKontextPipeline`.
The builders of the adapter in `adapters/flux_kontext.py`."""
from __future__ import annotations

from pathlib import Path

from omni_rl.models import register_tiny_model

from adapters.tiny.flux import build_tiny_flux_components


@register_tiny_model("flux_kontext")
def build_tiny_flux_kontext(folder: Path) -> None:
    """`tiny:flux`'s seeded components (the same weights), saved as a `FluxKontextPipeline`."""
    from diffusers import FluxKontextPipeline

    FluxKontextPipeline(**build_tiny_flux_components()).save_pretrained(Path(folder))

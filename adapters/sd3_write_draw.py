"""Stable Diffusion 3 with a prompt writer in front (`model.stage: write_draw`): the image model is
`adapters/sd3.py`'s, the writer a language model of its own (`model.adapter_options.writer`), the pair
trained as one trajectory by the `write_draw` family (`omni_rl/models/write_draw.py` says how).
`recipes/tiny_write_draw.yaml` runs it on the shape demo's SD3."""
from __future__ import annotations

from dataclasses import dataclass

from adapters.sd3 import StableDiffusion3Adapter
from omni_rl.models import register_adapter
from omni_rl.models.diffusion import PromptLengthOptions
from omni_rl.models.write_draw import WriteDrawModelBase, WriteDrawModelOptions


@dataclass
class SD3WriteDrawOptions(WriteDrawModelOptions, PromptLengthOptions):
    """SD3's options (`max_sequence_length`) and the writer's (`model.adapter_options`)."""

    def check(self) -> None:
        PromptLengthOptions.check(self)
        WriteDrawModelOptions.check(self)


@register_adapter("StableDiffusion3Pipeline", stage="write_draw")
class StableDiffusion3WriteDraw(WriteDrawModelBase, StableDiffusion3Adapter):
    options_class = SD3WriteDrawOptions

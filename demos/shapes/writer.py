"""`tiny:qwen3_shape_words`: a prompt writer for the shape model (`recipes/tiny_write_draw*.yaml`).

`tiny:qwen3` (two layers, hidden 32, random weights) with the shape grammar's words (`VOCABULARY`:
"red", "three", "circles", ...) as whole tokens after a space. With `tiny:qwen3`'s bytes alone a
random writer would have to hit a word letter by letter (" red" is 4 tokens of ~260, about 1 in
4.5e9), which RL cannot find; as one token of ~330, each word is about 1 in 330 per token, and a
few per request are enough for the detector's reward to show which ones help. Other text still
tokenises byte by byte, so the writer may write anything.
"""
from __future__ import annotations

from pathlib import Path

from adapters.tiny.qwen3 import write_tiny_qwen3
from demos.shapes.grammar import VOCABULARY
from omni_rl.models import register_tiny_model


@register_tiny_model("qwen3_shape_words")
def build_tiny_qwen3_shape_words(folder: Path) -> None:
    write_tiny_qwen3(folder, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                     words=VOCABULARY)

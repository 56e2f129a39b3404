"""The prompt record every prompt reader returns (`PromptItem`) and the error they raise
(`PromptFileError`), in a module of its own so that the readers depend on it and not on each
other; `prompts` and `chat_prompts` re-export both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omni_rl.errors import OmniConfigError


class PromptFileError(OmniConfigError):
    """A prompt file that cannot be read; the message names the file and the line."""


@dataclass(frozen=True)
class PromptItem:
    """One prompt.

    prompt:   the plain text: the prompt itself, or for a chat the text of its last user message
              (what rewards receive as `prompts[i]`).
    metadata: per-prompt data for the rewards, e.g. {"ground_truth": "3/4"} or an OCR target;
              for an image edit, "source_image" (an RGB PIL image) and the captions
              (`omni_rl.data.edit_prompts`).
    messages: the chat as a tuple of {"role", "content"} dicts, or None for a plain prompt (the
              text path then sends `prompt` as one user message).
    media:    None, or {"images": [RGB PIL images], "audio": [(float32 mono array, sample_rate)]}
              with either key absent when the prompt has none of that kind.
    origin:   where the prompt came from, for messages: "line 12" of a text or plain .jsonl file,
              "row 3" (or "row 3 (line 5)") of a chat or edit file, None for an inline prompt.
              Not part of the item's value: two items that differ only in it are equal.
    """

    prompt: str
    metadata: dict[str, Any] = field(default_factory=dict)
    messages: Optional[tuple] = None
    media: Optional[dict[str, Any]] = None
    origin: Optional[str] = field(default=None, compare=False)

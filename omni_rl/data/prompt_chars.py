"""A bound on a prompt's characters, applied when the prompts load, before any tokenizer sees them.

Fast tokenizers can abort on unbounded text, so each prompt is first counted against
`max_prompt_tokens` x `CHARS_PER_TOKEN` (or `DEFAULT_MAX_PROMPT_CHARS`); over it,
`overlong_prompts` applies as for tokens (`error`, `truncate` or `drop`).
Not here: counting tokens (`omni_rl.data.prompt_length`).
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

from omni_rl.data.prompt_item import PromptItem
from omni_rl.data.prompt_length import (
    OVERLONG_MODES, PromptLengthError, keep_last_chars, last_user_text, shown, text_of,
)

log = logging.getLogger(__name__)

# More characters than the longest token of the BPE vocabularies in use covers (their longest
# tokens are runs of spaces or punctuation, of at most a few dozen to a hundred-odd characters).
CHARS_PER_TOKEN = 256
# With no algo.family_options.max_prompt_tokens: about 50k tokens of English, tokenized in well under a second.
DEFAULT_MAX_PROMPT_CHARS = 200_000


def prompt_char_limit(max_prompt_tokens: Optional[int]) -> tuple[int, str]:
    """(the bound in characters, where it comes from, for messages)."""
    if max_prompt_tokens is None:
        return DEFAULT_MAX_PROMPT_CHARS, (f"{DEFAULT_MAX_PROMPT_CHARS:,} characters with max_prompt_tokens=null; a text "
                                          f"model sets algo.family_options.max_prompt_tokens to allow "
                                          f"{CHARS_PER_TOKEN} characters a token")
    bound = max_prompt_tokens * CHARS_PER_TOKEN
    return bound, f"algo.family_options.max_prompt_tokens={max_prompt_tokens} x {CHARS_PER_TOKEN} characters a token at most"


def prompt_chars(item: PromptItem) -> int:
    """The characters of `item`'s text: its prompt, or every text part of its messages."""
    if not item.messages:
        return len(item.prompt)
    # Text parts counted joined by "\n", as `last_user_text` joins them (what truncation cuts).
    return sum(len(text_of(message.get("content", ""))) for message in item.messages)


def bound_prompt_chars(items: Sequence[PromptItem], max_prompt_tokens: Optional[int], mode: str,
                       where: str) -> list[PromptItem]:
    """`items` with those over the character bound refused, truncated or dropped by `mode`
    (the family's `PromptLimitOptions`: a text model's `algo.family_options`, else the defaults);
    `where` names their source in messages. Raises `PromptLengthError`."""
    if mode not in OVERLONG_MODES:
        raise ValueError(f"overlong_prompts={mode!r}: expected one of {', '.join(OVERLONG_MODES)}")
    bound, bound_text = prompt_char_limit(max_prompt_tokens)
    kept, truncated, dropped = [], 0, 0
    for i, item in enumerate(items):
        n = prompt_chars(item)
        if n <= bound:
            kept.append(item)
            continue
        if mode == "drop":
            dropped += 1
            continue
        # The text truncation cannot cut (the other messages): the cut keeps `bound - rest`.
        rest = n - len(last_user_text(item))
        if mode == "error" or rest >= bound:
            raise PromptLengthError(
                f"{where}: prompt {i} ({shown(item)}) is {n:,} characters, over the bound of {bound:,} "
                f"({bound_text}) checked before tokenizing; shorten it, or (a text model) set "
                f"algo.family_options.overlong_prompts=truncate (keep its last characters) or drop (leave it out)"
            )
        kept.append(keep_last_chars(item, bound - rest))
        truncated += 1
    if not kept:
        raise PromptLengthError(
            f"{where}: all {len(items)} prompts are over the bound of {bound:,} characters ({bound_text}) and "
            f"algo.family_options.overlong_prompts=drop left none; use shorter prompts or raise "
            f"algo.family_options.max_prompt_tokens"
        )
    if truncated or dropped:
        log.warning("%s: %d prompts truncated to their last %s characters and %d dropped, over the character "
                    "bound checked before tokenizing (%s)", where, truncated, f"{bound:,}", dropped, bound_text)
    return kept

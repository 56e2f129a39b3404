"""Prompts longer than the model can take: found when the prompts load, and refused, truncated
or dropped by `overlong_prompts`, never silently.

`PromptLimitOptions` holds `max_prompt_tokens` and `overlong_prompts` (the text family's options
extend it). A prompt is measured as the model sees it, by a function the family passes in (this
module knows no tokenizer). `error` stops naming the prompt, `truncate` cuts the start of the
last user message and renders the chat again, `drop` leaves it out (docs/recipes.md says why);
`fit_prompt_lengths` returns the kept items and which were truncated or dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from omni_rl.option import ComponentOptions, option
from omni_rl.data.prompt_item import PromptFileError, PromptItem

OVERLONG_MODES = ("error", "truncate", "drop")
# Characters of a prompt shown in messages.
SHOWN_CHARS = 40


@dataclass
class PromptLimitOptions(ComponentOptions):
    """How long a prompt may be, and what happens to one that is longer (the text family's
    options, `algo.family_options`, extend this)."""

    max_prompt_tokens: Optional[int] = option(
        None, "The longest prompt in tokens, chat template included; null = the model's context (max_position_embeddings, "
              "else the tokenizer's model_max_length) less max_new_tokens. A prompt's characters are bounded before any "
              "tokenizer sees it, by 256 x this, or 200,000 characters when null.")
    overlong_prompts: str = option(
        "error", "A prompt over that limit (or the character bound), found when the prompts load: error stops the run "
                 "naming it; truncate cuts the start of its last user message; drop leaves it out.")

    def check(self) -> None:
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens={self.max_prompt_tokens!r}: expected an integer >= 1, or null for the "
                             f"model's context less max_new_tokens")
        if self.overlong_prompts not in OVERLONG_MODES:
            raise ValueError(f"overlong_prompts={self.overlong_prompts!r}: expected one of {', '.join(OVERLONG_MODES)}")


class PromptLengthError(PromptFileError):
    """A prompt longer than the model's limit (with `algo.family_options.overlong_prompts=error`), or a limit
    that leaves no room for a prompt; the message names the prompt or keys and what to do."""


@dataclass
class FitReport:
    """What `fit_prompt_lengths` did. Indices are positions in the list it was given.

    items:     the prompts to run: the short ones unchanged, the truncated ones replaced;
    truncated: (index, tokens before, tokens after) of each truncated prompt;
    dropped:   (index, tokens) of each dropped prompt.
    """

    items: list[PromptItem]
    truncated: list[tuple[int, int, int]] = field(default_factory=list)
    dropped: list[tuple[int, int]] = field(default_factory=list)


def shown(item: PromptItem) -> str:
    """The first characters of a prompt, for messages."""
    text = " ".join(item.prompt.split())
    return repr(text[:SHOWN_CHARS] + ("..." if len(text) > SHOWN_CHARS else ""))


def fit_prompt_lengths(
    items: Sequence[PromptItem],
    count_tokens: Callable[[PromptItem], int],
    limit: int,
    mode: str,
    where: str,
    limit_text: str,
) -> FitReport:
    """Apply `mode` to every prompt of `items` whose `count_tokens` is over `limit`.

    `where` and `limit_text` name the prompts' source and the limit's in messages. Raises
    `PromptLengthError` at the first over-long prompt in `error` mode, and in `truncate` mode for a
    prompt that cannot be cut to fit.
    """
    if mode not in OVERLONG_MODES:
        raise ValueError(f"algo.family_options.overlong_prompts={mode!r}: expected one of {', '.join(OVERLONG_MODES)}")
    report = FitReport(items=[])
    for i, item in enumerate(items):
        n = count_tokens(item)
        if n <= limit:
            report.items.append(item)
        elif mode == "error":
            raise PromptLengthError(
                f"{where}: prompt {i} ({shown(item)}) is {n} tokens with the chat template, over the "
                f"{limit}-token limit ({limit_text}); shorten it, or set algo.family_options.overlong_prompts=truncate "
                f"(keep its last tokens) or algo.family_options.overlong_prompts=drop (leave it out)"
            )
        elif mode == "drop":
            report.dropped.append((i, n))
        else:
            cut = truncate_to_limit(item, count_tokens, limit)
            if cut is None:
                raise PromptLengthError(
                    f"{where}: prompt {i} ({shown(item)}) is {n} tokens, over the {limit}-token limit "
                    f"({limit_text}), and cannot be cut to fit: its other messages, media and the chat "
                    f"template leave no room for its last user message; shorten them, or set "
                    f"algo.family_options.overlong_prompts=drop"
                )
            report.items.append(cut)
            report.truncated.append((i, n, count_tokens(cut)))
    if not report.items:
        raise PromptLengthError(
            f"{where}: all {len(items)} prompts are over the {limit}-token limit ({limit_text}) and "
            f"algo.family_options.overlong_prompts=drop left none; use shorter prompts or raise the limit"
        )
    return report


def truncate_to_limit(
    item: PromptItem, count_tokens: Callable[[PromptItem], int], limit: int
) -> Optional[PromptItem]:
    """`item` with the start of its last user message cut to fit `limit` tokens, or None if nothing fits.

    The kept length is found by doubling then bisection, so a long prompt costs about a dozen
    encodings of the kept text, not of the whole prompt.
    """
    length = len(last_user_text(item))
    if count_tokens(keep_last_chars(item, 0)) > limit:
        return None
    fits, over = 0, length  # keep=fits fits; keep=over does not (the whole prompt is over)
    probe = max(1, limit)
    while probe < over:
        if count_tokens(keep_last_chars(item, probe)) <= limit:
            fits, probe = probe, probe * 2
        else:
            over = probe
    while over - fits > 1:
        mid = (fits + over) // 2
        if count_tokens(keep_last_chars(item, mid)) <= limit:
            fits = mid
        else:
            over = mid
    return keep_last_chars(item, fits) if fits else None  # an emptied question is no prompt


def last_user_text(item: PromptItem) -> str:
    """The text of the last user message (what `keep_last_chars` cuts): `item.prompt` for a
    plain prompt, the joined text parts of that message for a chat."""
    if not item.messages:
        return item.prompt
    message = item.messages[_last_user(item)]
    return text_of(message["content"])


def keep_last_chars(item: PromptItem, keep: int) -> PromptItem:
    """`item` with only the last `keep` characters of its last user message's text (text parts
    are cut from the first one on; image and audio parts stay)."""
    if not item.messages:
        return replace(item, prompt=item.prompt[len(item.prompt) - keep:] if keep else "")
    index = _last_user(item)
    message = item.messages[index]
    content = message["content"]
    if isinstance(content, str):
        new_content: Any = content[len(content) - keep:] if keep else ""
    else:
        # Joined text parts are separated by "\n" (as `prompt` is built): the separators count
        # as characters to cut, so dropping a whole part removes its newline too.
        drop = max(0, len(text_of(content)) - keep)
        new_content = []
        for part in content:
            if part.get("type") != "text" or drop <= 0:
                new_content.append(dict(part))
            elif drop >= len(part["text"]):
                drop -= len(part["text"]) + 1  # the whole part goes, with the newline after it
            else:
                new_content.append({**part, "text": part["text"][drop:]})
                drop = 0
    messages = list(item.messages)
    messages[index] = {**message, "content": new_content}
    new = replace(item, messages=tuple(messages))
    return replace(new, prompt=text_of(new_content))


def _last_user(item: PromptItem) -> int:
    for index in range(len(item.messages) - 1, -1, -1):
        if item.messages[index].get("role") == "user":
            return index
    raise ValueError(f"prompt {shown(item)} has no user message to truncate")


def text_of(content: Any) -> str:
    """A message content's text: the string, or its text parts joined by a newline."""
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content if part.get("type") == "text")

"""Reading the answer containers of a text response: `\\boxed{...}` / `\\fbox{...}` and
`<answer>...</answer>`, shared by `math_answer`, `multiple_choice` and `format`, which decide
which container wins.

`boxed_contents` (every box; None for one never closed; braces balanced, `\\{` literal,
`\\boxed 5` takes the next token), `extract_boxed` (the last box, None if it is not closed),
`has_boxed`, `extract_answer_tag` (the last tag pair, case-insensitive) and `read_braced`. Each
runs in linear time however degenerate the response, since an untrained policy writes such.
"""
from __future__ import annotations

import re
from typing import Optional

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_TOKEN_RE = re.compile(r"[^\s$]*")
_ANSWER_OPEN_RE = re.compile(r"<answer>", re.IGNORECASE)
_ANSWER_CLOSE_RE = re.compile(r"</answer>", re.IGNORECASE)


def read_braced(text: str, start: int) -> Optional[tuple[str, int]]:
    """`text[start]` must be "{": return (content, index after the matching "}"), or None.

    A backslash escapes the next character, so `\\{` and `\\}` do not open or close a group.
    """
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None


def _brace_pairs(text: str) -> dict[int, int]:
    """Index of each "{" -> index of its matching "}", in one pass (unclosed ones are absent)."""
    pairs, stack = {}, []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            stack.append(i)
        elif char == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def boxed_contents(text: str) -> list[Optional[str]]:
    """The content of every `\\boxed`/`\\fbox` in `text`, in order; None for one never closed."""
    out: list[Optional[str]] = []
    pairs: Optional[dict[int, int]] = None  # computed once, so many boxes stay linear time
    for match in _BOX_RE.finditer(text):
        i = match.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            pairs = _brace_pairs(text) if pairs is None else pairs
            out.append(text[i + 1 : pairs[i]] if i in pairs else None)
        else:  # `\boxed 5`: the next token
            token = _TOKEN_RE.match(text, i).group(0)
            out.append(token or None)
    return out


def has_boxed(text: str) -> bool:
    """Whether `text` contains a `\\boxed` or `\\fbox` command (closed or not)."""
    return _BOX_RE.search(text) is not None


def extract_boxed(text: str) -> Optional[str]:
    """The content of the last `\\boxed{...}`; None if there is none or it is never closed."""
    boxes = boxed_contents(text)
    return boxes[-1] if boxes else None


def extract_answer_tag(text: str) -> Optional[str]:
    """The stripped content of the last `<answer>...</answer>` pair, or None."""
    # The last closing tag, then the last opening tag before it: linear time, unlike a lazy
    # regex over a degenerate response full of unclosed tags.
    closes = [m.start() for m in _ANSWER_CLOSE_RE.finditer(text)]
    if not closes:
        return None
    opens = [m.end() for m in _ANSWER_OPEN_RE.finditer(text, 0, closes[-1])]
    return text[opens[-1] : closes[-1]].strip() if opens else None

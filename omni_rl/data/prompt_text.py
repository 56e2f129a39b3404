"""A prompt file's text as every prompt reader takes it, and what a prompt's text may hold.

A hostile or broken file stops here in one `PromptFileError` naming its line and column:
`check_regular_file` refuses FIFOs and devices, `read_text_lines` reads UTF-8 and refuses
control characters but tab, `check_prompt_text` is the same rule for JSON or Parquet prompts
(newlines allowed), and `is_blank` counts zero-width characters as blank.
Not here: what a row holds besides its text (the readers), its length (`prompt_chars`).
"""
from __future__ import annotations

import stat
import unicodedata
from pathlib import Path
from typing import Optional, Sequence

from omni_rl.data.prompt_item import PromptFileError, PromptItem
from omni_rl.data.prompt_length import text_of

BOM = b"\xef\xbb\xbf"
# Zero-width characters that render as nothing: a line of them (and whitespace) is blank.
ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff")
# The file types `stat` tells apart, named for messages.
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_regular_file(file: Path, label: str) -> None:
    """PromptFileError unless `file` (which exists, and is no folder) is a regular file."""
    mode = file.stat().st_mode
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise PromptFileError(f"{label}: {file} is {kind}, not a regular file, so it is not read; expected a .txt, "
                          f".jsonl or .parquet file")


def is_blank(text: str) -> bool:
    """Whether `text` holds only whitespace and zero-width characters."""
    return all(c.isspace() or c in ZERO_WIDTH for c in text)


def read_text_lines(file: Path, label: str) -> list[str]:
    """The lines of UTF-8 text file `file` (BOM dropped, CRLF accepted); `label` names it in errors."""
    data = file.read_bytes()
    skipped = len(BOM) if data.startswith(BOM) else 0
    try:
        text = data[skipped:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = err.start + skipped
        line = data.count(b"\n", 0, at) + 1
        raise PromptFileError(
            f"{label}: {file} is not UTF-8 text (byte {at}, line {line}: "
            f"{data[at:at + 4]!r}); expected a UTF-8 {file.suffix} file (convert text in "
            f"another encoding, e.g. `iconv -f latin1 -t utf-8`; a Parquet file must be named .parquet)"
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the file's final newline ends the last line; it starts none
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    for n, line in enumerate(lines, start=1):
        column = _control_at(line, allowed="\t")
        if column is not None:
            raise PromptFileError(f"{label}: line {n}, column {column + 1}: {_refusal(line[column], 'tabs')}")
    return lines


def check_prompt_text(items: Sequence[PromptItem], where: str) -> None:
    """PromptFileError naming the first prompt of `items` whose text (its prompt, the text of
    its messages) holds a control character other than tab and newline."""
    for i, item in enumerate(items):
        texts = [item.prompt, *(text_of(m.get("content", "")) for m in item.messages or ())]
        for text in texts:
            column = _control_at(text, allowed="\t\n")
            if column is not None:
                at = item.origin or f"prompt {i}"
                raise PromptFileError(f"{where}: {at}: character {column + 1} of its text: "
                                      f"{_refusal(text[column], 'tabs and newlines')}")


def _control_at(text: str, allowed: str) -> Optional[int]:
    """Index of the first control character (Unicode category Cc) of `text` not in `allowed`."""
    for i, c in enumerate(text):
        if unicodedata.category(c) == "Cc" and c not in allowed:
            return i
    return None


# Unicode gives control characters no names (`unicodedata.name` has none): the common ones'.
_NAMES = {"\x00": "NUL", "\x07": "BEL", "\x08": "BACKSPACE", "\x0b": "VERTICAL TAB", "\x0c": "FORM FEED",
          "\r": "CARRIAGE RETURN", "\x1b": "ESC", "\x7f": "DELETE", "\x85": "NEXT LINE", "\x9b": "CSI"}


def _refusal(char: str, allowed: str) -> str:
    name = _NAMES.get(char, "a control code")
    binary = " (a NUL: is it a binary file?)" if char == "\x00" else ""
    lone_cr = " (a lone CR: convert old Mac line endings to LF)" if char == "\r" else ""
    return (f"control character U+{ord(char):04X} ({name}){binary}{lone_cr}; prompts hold text and {allowed} only "
            f"(a control character can rewrite the terminal it is printed on): remove it")

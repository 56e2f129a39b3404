"""Byte-level vocabularies for the tiny random-weight models' tokenizers.

Tests and CPU demos cannot download a real tokenizer, so the tiny models use byte-level BPE
vocabularies with no merges: every byte is a token (so any prompt tokenises without unknowns),
written as the vocab.json / merges.txt files that transformers' BPE tokenizers load.

- `byte_chars()`: the GPT-2 byte-to-character table (printable bytes map to themselves, the
  others to code points from 256 up, so each byte has a visible one-character token);
- `clip_byte_vocab()`: CLIP's layout: each byte with and without the end-of-word marker `</w>`,
  then `<|startoftext|>` (512) and `<|endoftext|>` (513);
- `write_bpe_files(folder, vocab)`: vocab.json and an empty merges.txt;
- `bpe_files(vocab)`: the same two files in a scratch folder that is gone after the `with`
  block (a tokenizer built from them inside the block keeps what it needs);
- `t5_char_vocab()`: a SentencePiece-style Unigram vocabulary for T5 / UMT5 tokenizers
  (`T5Tokenizer(vocab=...)`): T5's `<pad>`, `</s>`, `<unk>` at ids 0-2, then every printable
  ASCII character with and without the word-start marker `▁`; other characters are `<unk>`.
"""
from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path


def byte_chars() -> list[str]:
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def clip_byte_vocab() -> dict[str, int]:
    chars = byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": 256 + i for i, c in enumerate(chars)})
    vocab["<|startoftext|>"] = 512
    vocab["<|endoftext|>"] = 513
    return vocab


def write_bpe_files(folder: Path, vocab: dict[str, int]) -> tuple[Path, Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return folder / "vocab.json", folder / "merges.txt"


@contextlib.contextmanager
def bpe_files(vocab: dict[str, int]) -> Iterator[tuple[Path, Path]]:
    with tempfile.TemporaryDirectory(prefix="omni_rl_vocab_") as scratch:
        yield write_bpe_files(Path(scratch), vocab)


def t5_char_vocab() -> list[tuple[str, float]]:
    chars = [chr(c) for c in range(33, 127)]
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    # Equal scores: the Unigram model then picks the fewest pieces, "▁" + first character, then
    # one piece per character.
    pieces += [("\u2581" + c, -5.0) for c in chars] + [(c, -5.0) for c in chars]
    return pieces

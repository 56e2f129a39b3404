"""Byte-level vocabularies for the tiny random-weight models' tokenizers.

Tests and CPU demos cannot download a tokenizer, so tiny models use byte-level BPE vocabularies
with no merges (any prompt tokenises): `clip_byte_vocab()`, `with_whole_words(vocab, words)`,
`write_bpe_files` / `bpe_files`, and `t5_char_vocab()` (a Unigram vocabulary for T5 / UMT5).
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


def with_whole_words(vocab: dict[str, int], words: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) adding each of `words` as one end-of-word token.

    The merges are learned as BPE learns them on `words` (most frequent adjacent pair first, ties in
    sorted order), so each word tokenises whole and other text byte by byte. `ValueError` for a word
    that is not lower-case ASCII letters.
    """
    for word in words:
        if not (word.isascii() and word.isalpha() and word.islower()):
            raise ValueError(f"word {word!r}: expected lower-case ASCII letters (a closed caption vocabulary)")
    pieces = [list(w[:-1]) + [w[-1] + "</w>"] for w in sorted(set(words))]
    vocab, merges = dict(vocab), []
    while True:
        counts: dict[tuple[str, str], int] = {}
        for word in pieces:
            for pair in zip(word, word[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            return vocab, merges
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))
        pieces = [_merge(word, best) for word in pieces]


def _merge(word: list[str], pair: tuple[str, str]) -> list[str]:
    out, k = [], 0
    while k < len(word):
        if k + 1 < len(word) and (word[k], word[k + 1]) == pair:
            out.append(word[k] + word[k + 1])
            k += 2
        else:
            out.append(word[k])
            k += 1
    return out


def write_bpe_files(folder: Path, vocab: dict[str, int], merges=()) -> tuple[Path, Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return folder / "vocab.json", folder / "merges.txt"


@contextlib.contextmanager
def bpe_files(vocab: dict[str, int], merges=()) -> Iterator[tuple[Path, Path]]:
    with tempfile.TemporaryDirectory(prefix="omni_rl_vocab_") as scratch:
        yield write_bpe_files(Path(scratch), vocab, merges)


def t5_char_vocab() -> list[tuple[str, float]]:
    chars = [chr(c) for c in range(33, 127)]
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    # Equal scores: the Unigram model then picks the fewest pieces, "▁" + first character, then
    # one piece per character.
    pieces += [("\u2581" + c, -5.0) for c in chars] + [(c, -5.0) for c in chars]
    return pieces

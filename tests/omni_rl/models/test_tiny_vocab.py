"""Tiny tokenizer vocabularies: whole-word merges learned on a closed vocabulary
(`with_whole_words`) make each of its words one token through transformers' own CLIPTokenizer,
and leave every other text tokenisable."""
import pytest
from transformers import CLIPTokenizer

from demos.shapes.grammar import VOCABULARY
from omni_rl.models.tiny_vocab import bpe_files, clip_byte_vocab, with_whole_words


def _tokenizer(words):
    vocab, merges = with_whole_words(clip_byte_vocab(), words)
    with bpe_files(vocab, merges) as (vocab_file, merges_file):
        return CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=16), vocab


def test_every_grammar_word_is_one_token_and_other_text_still_tokenises():
    tok, vocab = _tokenizer(VOCABULARY)
    for word in VOCABULARY:
        assert tok.tokenize(word) == [f"{word}</w>"]
    assert tok.tokenize("three red squares above a circle") == ["three</w>", "red</w>", "squares</w>", "above</w>", "a</w>", "circle</w>"]
    pieces = tok.tokenize("a purple hexagon")  # outside the vocabulary: smaller pieces, no unknowns
    assert "".join(pieces).replace("</w>", "") == "apurplehexagon" and tok.unk_token not in pieces
    assert len(vocab) > 514 and with_whole_words(clip_byte_vocab(), list(reversed(VOCABULARY))) == (vocab, with_whole_words(clip_byte_vocab(), VOCABULARY)[1])


def test_words_must_be_lower_case_letters():
    with pytest.raises(ValueError, match="'Red'"):
        with_whole_words(clip_byte_vocab(), ["Red"])

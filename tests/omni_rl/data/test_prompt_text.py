"""omni_rl/data/prompt_text.py through the prompt readers: the hostile prompt files of issue 45 (L5)
and a fuzz test of the reader (any bytes read to prompts or raise PromptFileError, nothing else)."""
import json
import os
import string

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from omni_rl.data.chat_prompts import load_chat_items
from omni_rl.data.prompt_text import is_blank
from omni_rl.data.prompts import PromptFileError, PromptItem, load_prompt_items, read_prompt_file


def test_a_byte_order_mark_is_not_part_of_the_first_prompt(tmp_path):
    file = tmp_path / "p.txt"
    file.write_bytes(b"\xef\xbb\xbfa cat\r\na dog\r\n")
    assert [i.prompt for i in read_prompt_file(str(file))] == ["a cat", "a dog"]
    rows = tmp_path / "p.jsonl"
    rows.write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompt": "a cat"}).encode() + b"\n")
    assert [i.prompt for i in read_prompt_file(str(rows))] == ["a cat"]


def test_lines_of_zero_width_spaces_are_blank(tmp_path):
    file = tmp_path / "p.txt"
    file.write_text("a cat\n\u200b\u200b\n \u2060\u3000\t\n# a comment\na dog\n", encoding="utf-8")
    items = read_prompt_file(str(file))
    assert [(i.prompt, i.origin) for i in items] == [("a cat", "line 1"), ("a dog", "line 5")]
    assert is_blank("\u200b \u200d\ufeff") and not is_blank("\u200ba")


def test_a_jsonl_prompt_of_zero_width_spaces_is_empty(tmp_path):
    file = tmp_path / "p.jsonl"
    file.write_text(json.dumps({"prompt": "a cat"}) + "\n" + json.dumps({"prompt": "\u200b\u200b"}) + "\n")
    with pytest.raises(PromptFileError, match=r"prompt 1 is empty"):
        load_prompt_items(None, str(file))


@pytest.mark.parametrize("text, where, code", [
    (b"a cat\nnul\x00byte\n", "line 2, column 4", "U+0000 (NUL) (a NUL: is it a binary file?)"),
    (b"a cat\n\x1b[2J\x1b[Hclear\n", "line 2, column 1", "U+001B (ESC)"),
    (b"\x1b]0;owned\x07title\n", "line 1, column 1", "U+001B (ESC)"),
    (b"old\rmac\r", "line 1, column 4", "U+000D (CARRIAGE RETURN) (a lone CR: convert old Mac line endings to LF)"),
    ("# \x9b31m in a comment\n".encode(), "line 1, column 3", "U+009B (CSI)"),
])
def test_control_characters_in_a_text_file_are_refused_naming_line_and_column(tmp_path, text, where, code):
    file = tmp_path / "p.txt"
    file.write_bytes(text)
    with pytest.raises(PromptFileError) as err:
        load_prompt_items(None, str(file))
    assert str(err.value) == (f"data.prompt_file='{file}': {where}: control character {code}; prompts hold text and "
                              f"tabs only (a control character can rewrite the terminal it is printed on): remove it")


def test_a_tab_is_kept(tmp_path):
    file = tmp_path / "p.txt"
    file.write_text("a\tcat\n")
    assert [i.prompt for i in read_prompt_file(str(file))] == ["a\tcat"]


def test_control_characters_decoded_from_json_are_refused(tmp_path):
    file = tmp_path / "p.jsonl"
    file.write_text(json.dumps({"prompt": "two\nlines"}) + "\n" + json.dumps({"prompt": "x\u001b]0;title\u0007"}) + "\n")
    with pytest.raises(PromptFileError) as err:
        load_prompt_items(None, str(file))
    assert str(err.value).startswith(f"data.prompt_file='{file}': line 2: character 2 of its text: control character "
                                     f"U+001B (ESC); prompts hold text and tabs and newlines only")


def test_control_characters_in_a_chat_message_are_refused(tmp_path):
    file = tmp_path / "chat.jsonl"
    file.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi\u0000"}], "ground_truth": "1"}) + "\n")
    with pytest.raises(PromptFileError, match=r"row 1: character 3 of its text: control character U\+0000 \(NUL\)"):
        load_prompt_items(None, str(file))


def test_inline_prompts_are_checked_too():
    with pytest.raises(PromptFileError, match=r"^data.prompts: prompt 1: character 1 of its text: control character U\+001B"):
        load_prompt_items(["a cat", "\x1b[2J"], None)


@pytest.mark.parametrize("special, kind", [("/dev/zero", "a character device"), ("/dev/urandom", "a character device")])
def test_a_device_is_reported_as_not_a_regular_file(special, kind):
    with pytest.raises(PromptFileError) as err:
        load_prompt_items(None, special)
    assert str(err.value) == (f"data.prompt_file='{special}': {special} is {kind}, not a regular file, so it is not "
                              f"read; expected a .txt, .jsonl or .parquet file")


@pytest.mark.parametrize("name", ["p.txt", "p.jsonl", "p.parquet"])
def test_a_fifo_is_reported_without_being_opened(tmp_path, name):
    # No writer ever comes: opening the FIFO to read it would block this test for good.
    fifo = tmp_path / name
    os.mkfifo(fifo)
    with pytest.raises(PromptFileError, match=r"is a FIFO \(named pipe\), not a regular file, so it is not read"):
        load_prompt_items(None, str(fifo))
    with pytest.raises(PromptFileError, match=r"^chat prompt file .* is a FIFO"):
        load_chat_items(fifo)


# --- fuzz: any bytes either read to prompts or raise PromptFileError ---------------------------
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Rows that look like the readers' own: a prompt, and some of the keys that pick a reader or fill metadata.
_KEYS = ["prompt", "metadata", "images", "audio", "ground_truth", "reward_model", "source_image", "image",
         "ability", "instruction", "tag"]
_rows = st.dictionaries(st.sampled_from(_KEYS), _json_values | st.text(alphabet=string.printable, max_size=30),
                        max_size=5).map(lambda row: json.dumps(row).encode())
_files = st.one_of(
    st.binary(max_size=300),
    st.lists(st.one_of(_rows, st.binary(max_size=40), st.text(max_size=30).map(str.encode)), max_size=6)
    .map(b"\n".join),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_files, suffix=st.sampled_from([".txt", ".jsonl", ".parquet"]))
def test_any_bytes_read_to_prompts_or_a_prompt_file_error(tmp_path, data, suffix):
    file = tmp_path / f"fuzz{suffix}"
    file.write_bytes(data)
    try:
        items = load_prompt_items(None, str(file))
    except PromptFileError as err:
        assert str(err) and "\n" not in str(err).strip()  # one line, saying something
        return
    assert items and all(isinstance(i, PromptItem) and isinstance(i.prompt, str) for i in items)

"""Prompt files that cannot be used are named, with what they are (omni_rl/data/prompts.py), and
`check_prompt_sources` finds them from the data config before anything loads."""
import pytest

from omni_rl.config.schema import DataConfig
from omni_rl.data.prompts import PromptFileError, check_prompt_sources, load_prompt_items, read_prompt_file


def _data(**fields):
    return DataConfig(**fields)


def test_a_binary_file_is_named_with_where_it_stops_being_text(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"a cat\na dog\n\x89PNG\r\n")
    with pytest.raises(PromptFileError) as info:
        load_prompt_items(None, str(path))
    message = str(info.value)
    assert message.startswith(f"data.prompt_file='{path}': {path} is not UTF-8 text (byte 12, line 3")
    assert "expected a UTF-8 .txt file" in message


def test_a_binary_jsonl_file_is_named_too(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9"}\n')  # latin-1, not UTF-8
    with pytest.raises(PromptFileError, match=r"rows.jsonl is not UTF-8 text \(byte 15, line 1"):
        read_prompt_file(str(path))


@pytest.mark.parametrize("content", ["", "\n\n", "# a comment only\n   \n"])
def test_an_empty_file_names_its_key_and_the_file(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_text(content)
    with pytest.raises(PromptFileError, match=rf"^data.prompt_file='{path}': no prompts in {path}"):
        load_prompt_items(None, str(path))
    with pytest.raises(PromptFileError, match=rf"^data.val_prompt_file='{path}': no prompts in {path}"):
        load_prompt_items(None, str(path), "data.val_prompts")


def test_a_folder_is_called_a_folder(tmp_path):
    with pytest.raises(PromptFileError, match=r"data.prompt_file='.*' is a folder, expected a .txt, .jsonl or .parquet file"):
        load_prompt_items(None, str(tmp_path))
    with pytest.raises(PromptFileError, match=r"does not exist \(looked for .*nope.txt\)"):
        load_prompt_items(None, str(tmp_path / "nope.txt"))


def test_a_missing_file_says_where_a_recipe_tells_how_to_get_it(tmp_path):
    # Not "check the path" alone: the real recipes that do not ship their data name the public
    # file in their header, and the message ends with the override to point at it.
    missing = str(tmp_path / "test.txt")
    with pytest.raises(PromptFileError) as err:
        load_prompt_items(None, missing, "data.val_prompts")
    assert str(err.value) == (
        f"data.val_prompt_file={missing!r} does not exist (looked for {missing}); check the path, or get the "
        f"file: a recipe that does not ship its data says in its header (recipes/NAME.yaml, under 'Data:') which "
        f"public file it reads, its format and where to get it; then set data.val_prompt_file=PATH")


def test_an_empty_prompt_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": " "}\n')
    with pytest.raises(PromptFileError, match=rf"data.prompt_file='{path}': prompt 1 is empty"):
        load_prompt_items(None, str(path))


def test_check_prompt_sources_reads_the_training_and_validation_files(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("a cat\na dog\n")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe")
    check_prompt_sources(_data(prompt_file=str(good), val_prompt_file=str(good)))
    with pytest.raises(PromptFileError, match="^data.prompt_file="):
        check_prompt_sources(_data(prompt_file=str(bad)))
    with pytest.raises(PromptFileError, match="^data.val_prompt_file="):
        check_prompt_sources(_data(prompt_file=str(good), val_prompt_file=str(bad)))
    # Inline prompts win over a file, so the file is not read (as the trainer does).
    check_prompt_sources(_data(prompts=["a cat"], prompt_file=str(bad), val_prompts=["x"], val_prompt_file=str(bad)))

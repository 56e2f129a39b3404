"""omni_rl/data/edit_prompts.py (and its dispatch in prompts.py), on files written to tmp_path."""
import base64
import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from omni_rl.data.edit_prompts import item_has_source_image, load_edit_items
from omni_rl.data.prompts import PromptFileError, PromptItem, load_prompt_items, read_prompt_file

ROOT = Path(__file__).resolve().parents[3]


def _jsonl(path, *rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def _png_bytes(colour=(255, 0, 0), size=(4, 3), mode="RGB"):
    buffer = io.BytesIO()
    Image.new(mode, size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def _b64(colour, **kwargs):
    return base64.b64encode(_png_bytes(colour, **kwargs)).decode()


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "img").mkdir()
    Image.new("RGB", (4, 3), (0, 255, 0)).save(tmp_path / "img" / "green.png")
    return tmp_path


def test_a_row_becomes_an_item_with_its_source_in_metadata_and_media(folder):
    row = {
        "instruction": "make it brighter", "source_image": "img/green.png", "target_text": "a bright green card",
        "source_text": "a green card", "metadata": {"brightness_direction": 1, "id": "a"}, "other": "ignored",
    }
    (item,) = load_edit_items(_jsonl(folder / "d.jsonl", row))
    assert item.prompt == "make it brighter" and item.messages is None
    source = item.metadata["source_image"]
    assert isinstance(source, Image.Image) and source.mode == "RGB" and source.size == (4, 3)
    assert source.getpixel((0, 0)) == (0, 255, 0)
    assert item.media == {"images": [source]} and item.media["images"][0] is source
    assert item.metadata == {
        "brightness_direction": 1, "id": "a", "target_text": "a bright green card", "source_text": "a green card",
        "source_image": source,
    }
    assert item_has_source_image(item)


def test_image_forms_path_absolute_base64_data_uri_structs_and_alpha(folder):
    Image.new("RGBA", (2, 2), (0, 0, 0, 0)).save(folder / "clear.png")
    (folder / "sub").mkdir()
    rows = [
        {"instruction": "a", "source_image": str(folder / "img" / "green.png")},     # absolute path
        {"instruction": "b", "source_image": _b64((255, 0, 0))},                     # bare base64
        {"instruction": "c", "source_image": "data:image/png;base64," + _b64((0, 0, 255))},
        {"instruction": "d", "source_image": {"bytes": _b64(128, mode="L"), "path": None}},
        {"instruction": "e", "source_image": {"bytes": None, "path": "../clear.png"}},  # relative to sub/
    ]
    items = load_edit_items(_jsonl(folder / "sub" / "d.jsonl", *rows), allow_outside=True)
    pixels = [item.metadata["source_image"].getpixel((0, 0)) for item in items]
    # grey -> RGB; transparent pixels become white, not the black stored under alpha 0
    assert pixels == [(0, 255, 0), (255, 0, 0), (0, 0, 255), (128, 128, 128), (255, 255, 255)]
    assert all(item.metadata["source_image"].mode == "RGB" for item in items)


def test_prompt_alias_optional_fields_and_nulls(folder):
    rows = [
        {"prompt": "make it darker", "source_image": "img/green.png"},
        {"instruction": "same", "prompt": "same", "source_image": "img/green.png", "target_text": None,
         "reference_image": _b64((1, 2, 3)), "metadata": None},
    ]
    first, second = load_edit_items(_jsonl(folder / "d.jsonl", *rows))
    assert first.prompt == "make it darker" and sorted(first.metadata) == ["source_image"]
    assert second.prompt == "same" and sorted(second.metadata) == ["reference_image", "source_image"]
    assert second.metadata["reference_image"].getpixel((0, 0)) == (1, 2, 3)
    assert second.media["images"] == [second.metadata["source_image"]]  # the reference is not the source


def test_read_prompt_file_dispatches_edit_files_and_leaves_others_alone(folder):
    edit = _jsonl(folder / "edit.jsonl", {"instruction": "x", "source_image": "img/green.png"})
    plain = _jsonl(folder / "plain.jsonl", {"prompt": "a cat", "metadata": {"k": 1}})
    chat = _jsonl(folder / "chat.jsonl", {"prompt": "what?", "images": ["img/green.png"]})
    (item,) = read_prompt_file(str(edit))
    assert item_has_source_image(item)
    assert read_prompt_file(str(plain)) == [PromptItem("a cat", {"k": 1})]
    (chat_item,) = read_prompt_file(str(chat))
    assert chat_item.messages is not None and not item_has_source_image(chat_item)
    assert not item_has_source_image(PromptItem("a cat"))
    # load_prompt_items (what the trainer calls) accepts the edit items as they are
    assert load_prompt_items(None, str(edit)) == [item]


def test_parquet_edit_rows_bytes_and_structs(folder):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({
        "instruction": ["make it brighter", None],
        "prompt": [None, "make it darker"],
        "source_image": [{"bytes": _png_bytes((9, 8, 7)), "path": None}, {"bytes": None, "path": "img/green.png"}],
        "target_text": ["a bright card", None],
        "reference_image": [None, _png_bytes((4, 5, 6))],
    })
    pq.write_table(table, folder / "d.parquet")
    for items in (load_edit_items(folder / "d.parquet"), read_prompt_file(str(folder / "d.parquet"))):
        first, second = items
        assert first.prompt == "make it brighter" and first.metadata["target_text"] == "a bright card"
        assert first.media["images"][0].getpixel((0, 0)) == (9, 8, 7)
        assert second.prompt == "make it darker" and "target_text" not in second.metadata
        assert second.metadata["source_image"].getpixel((0, 0)) == (0, 255, 0)
        assert second.metadata["reference_image"].getpixel((0, 0)) == (4, 5, 6)
    # Raw binary column, and a Parquet file without a source_image column stays a chat file.
    pq.write_table(pa.table({"instruction": ["x"], "source_image": [_png_bytes((3, 3, 3))]}), folder / "raw.parquet")
    assert read_prompt_file(str(folder / "raw.parquet"))[0].metadata["source_image"].getpixel((0, 0)) == (3, 3, 3)
    pq.write_table(pa.table({"prompt": ["hello"]}), folder / "chat.parquet")
    (chat,) = read_prompt_file(str(folder / "chat.parquet"))
    assert chat.messages == ({"role": "user", "content": "hello"},) and not item_has_source_image(chat)
    # A corrupt image names the Parquet row and field.
    pq.write_table(pa.table({"instruction": ["ok", "bad"], "source_image": [_png_bytes(), b"garbage"]}), folder / "bad.parquet")
    with pytest.raises(PromptFileError, match=r"bad.parquet: row 2: source_image: the image bytes \(7 bytes\) is not a readable image"):
        read_prompt_file(str(folder / "bad.parquet"))


GOOD = {"instruction": "make it brighter", "source_image": "img/green.png"}

BAD_ROWS = [
    ({"instruction": "x"},
     r"row 2: missing 'source_image' \(keys: \['instruction'\]\); an edit row needs the image to edit: a file path"),
    ({"instruction": "x", "source_image": "img/nope.png"},
     r"row 2: source_image: image path 'img/nope.png' does not exist \(looked for .*img/nope.png\); paths are relative to the data file's folder"),
    ({"instruction": "x", "source_image": {"path": "img/nope.png"}},
     r"row 2: source_image: file 'img/nope.png' does not exist"),
    ({"instruction": "x", "source_image": "data:image/png;base64," + base64.b64encode(b"not a png").decode()},
     r"row 2: source_image: the base64 data URI is not a readable image \(UnidentifiedImageError"),
    ({"instruction": "x", "source_image": "data:image/png;base64,@@@"},
     r"row 2: source_image: not valid base64"),
    ({"instruction": "x", "source_image": 7},
     r"row 2: source_image has type int; expected image bytes, a base64 string, a file path, or a \{bytes, path\} object"),
    ({"instruction": "x", "source_image": {"url": "http://x"}},
     r"row 2: source_image: an image object needs 'bytes' or 'path', got keys \['url'\]"),
    ({"instruction": 3, "source_image": "img/green.png"},
     r"row 2: 'instruction' is 3 \(int\); expected a string, the edit to make"),
    ({"prompt": ["make", "it"], "source_image": "img/green.png"},
     # A list prompt is read as chat messages (verl-omni's edit rows), which these are not.
     r"row 2: prompt\[0\] is 'make'; expected an object with 'role' and 'content'"),
    ({"instruction": "  ", "source_image": "img/green.png"},
     r"row 2: 'instruction' is empty; expected the edit to make"),
    ({"source_image": "img/green.png"},
     r"row 2: missing 'instruction' \(keys: \['source_image'\]\); an edit row needs the edit as a string"),
    ({"instruction": "a", "prompt": "b", "source_image": "img/green.png"},
     r"row 2: 'instruction' is 'a' but 'prompt' is 'b'; give the edit once"),
    ({"instruction": "x", "source_image": "img/green.png", "target_text": 5},
     r"row 2: 'target_text' is 5 \(int\); expected a string \(a caption\), or leave it out"),
    ({"instruction": "x", "source_image": "img/green.png", "source_text": ["a"]},
     r"row 2: 'source_text' is \['a'\] \(list\); expected a string"),
    ({"instruction": "x", "source_image": "img/green.png", "reference_image": "img/missing.png"},
     r"row 2: reference_image: image path 'img/missing.png' does not exist"),
    ({"instruction": "x", "source_image": "img/green.png", "metadata": [1]},
     r"row 2: 'metadata' has type list; expected an object"),
    ({"instruction": "x", "source_image": "img/green.png", "metadata": {"target_text": "y"}},
     r"row 2: metadata holds \['target_text'\], which an edit row sets itself; give them as top-level fields"),
    ('{"instruction": "x", "source_image": ',
     r"row 2: not valid JSON \(Expecting value at column 38\)"),
    ("[1, 2]",
     r"row 2: expected an object with 'instruction' and 'source_image', got list"),
]


@pytest.mark.parametrize("row, message", BAD_ROWS, ids=[m[:40] for _, m in BAD_ROWS])
def test_every_bad_row_names_the_file_row_and_field(folder, row, message):
    path = _jsonl(folder / "d.jsonl", GOOD, row)
    for read in (lambda: load_edit_items(path), lambda: read_prompt_file(str(path))):
        with pytest.raises(PromptFileError, match=re.escape(str(path)) + ": " + message):
            read()


def test_rows_after_blank_lines_name_the_line_and_a_corrupt_image_file(folder):
    (folder / "img" / "broken.png").write_bytes(b"\x89PNG not really")
    path = folder / "d.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps({"instruction": "x", "source_image": "img/broken.png"}) + "\n")
    with pytest.raises(PromptFileError, match=r"d.jsonl: row 2 \(line 3\): source_image: file 'img/broken.png' is not a readable image"):
        load_edit_items(path)


def test_missing_file_and_wrong_suffix(tmp_path):
    with pytest.raises(PromptFileError, match=r"edit prompt file '.*nope.jsonl' does not exist"):
        load_edit_items(tmp_path / "nope.jsonl")
    with pytest.raises(PromptFileError, match=r"data.prompt_file='.*nope.jsonl' does not exist"):
        read_prompt_file(str(tmp_path / "nope.jsonl"), "data.prompt_file")
    (tmp_path / "d.csv").write_text("x")
    with pytest.raises(PromptFileError, match=r"expected a .jsonl or .parquet file"):
        load_edit_items(tmp_path / "d.csv")


def test_the_tiny_edit_dataset_loads_with_directions_and_captions():
    items = read_prompt_file("recipes/prompts/tiny_edit.jsonl")
    assert len(items) == 8 and all(item_has_source_image(i) for i in items)
    assert {i.metadata["brightness_direction"] for i in items} == {1, -1}
    assert all(isinstance(i.metadata["target_text"], str) and i.metadata["source_text"] for i in items)
    colours = {i.metadata["source_image"].getpixel((0, 0)) for i in items}
    assert len(colours) == 8 and all(i.metadata["source_image"].size == (32, 32) for i in items)
    # the script that wrote them writes the same pixels again
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tiny_edit", ROOT / "recipes/prompts/make_tiny_edit.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for (stem, rgb, *_), item in zip(script.ROWS, items):
        assert item.metadata["source_image"].tobytes() == Image.fromarray(script.source_pixels(rgb)).tobytes()


# verl-omni's Qwen-Image-Edit Parquet, in the schema its converters write (verl-project/verl-omni,
# examples/flowgrpo_trainer/qwen_image_edit/prepare_data.py and data_process/qwenimageedit_image.py):
# data_source, prompt = [system, user "Picture 1: <image>{instruction}"], negative_prompt,
# ability "image_edit", images = [{"bytes": PNG}], reward_model {"style": "model", "ground_truth"},
# extra_info.
def _verl_edit_parquet(path, instructions):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    system = "Describe the key features of the input image, then explain how the instruction alters it."
    n = len(instructions)
    pq.write_table(pa.table({
        "data_source": ["image_edit"] * n,
        "prompt": [[{"role": "system", "content": system}, {"role": "user", "content": f"Picture 1: <image>{text}"}]
                   for text in instructions],
        "negative_prompt": [[{"role": "system", "content": system}, {"role": "user", "content": "Picture 1: <image> "}]] * n,
        "ability": ["image_edit"] * n,
        "images": [[{"bytes": _png_bytes((0, 20 * k, 0))}] for k in range(n)],
        "reward_model": [{"style": "model", "ground_truth": text} for text in instructions],
        "extra_info": [{"split": "train", "index": k, "instruction": text, "image": f"{k}.png"}
                       for k, text in enumerate(instructions)],
    }), path)
    return path


def test_verl_omni_edit_parquet_rows_carry_their_source_image_to_the_rewards(tmp_path):
    path = _verl_edit_parquet(tmp_path / "train.parquet", ["make it brighter", "make it darker"])
    first, second = read_prompt_file(str(path))
    # The edit rewards read metadata["source_image"]; the edit adapters media["images"][0].
    assert item_has_source_image(first) and item_has_source_image(second)
    assert first.metadata["source_image"].getpixel((0, 0)) == (0, 0, 0)
    assert second.metadata["source_image"].getpixel((0, 0)) == (0, 20, 0)
    assert second.media["images"] == [second.metadata["source_image"]]
    # The instruction without the placeholder and its "Picture 1:" label.
    assert [first.prompt, second.prompt] == ["make it brighter", "make it darker"]
    assert second.origin == "row 2"


def test_flow_factory_prompt_image_rows_are_edit_rows(tmp_path):
    # Flow-Factory's and verl-omni's {"prompt", "image"} rows, the image in the dataset's images/ folder.
    (tmp_path / "images").mkdir()
    Image.new("RGB", (4, 3), (0, 0, 255)).save(tmp_path / "images" / "blue.png")
    Image.new("RGB", (4, 3), (9, 9, 9)).save(tmp_path / "here.png")
    rows = _jsonl(tmp_path / "train.jsonl", {"prompt": "make it brighter", "image": "blue.png"},
                  {"prompt": "make it darker", "image": "here.png"})
    first, second = read_prompt_file(str(rows))
    assert first.metadata["source_image"].getpixel((0, 0)) == (0, 0, 255) and first.prompt == "make it brighter"
    assert second.media["images"][0].getpixel((0, 0)) == (9, 9, 9)
    missing = _jsonl(tmp_path / "missing.jsonl", {"prompt": "p", "image": "nope.png"})
    with pytest.raises(PromptFileError, match=r"row 1: image: image path 'nope.png' does not exist \(looked in .* and its images/ folder\)"):
        read_prompt_file(str(missing))
    both = _jsonl(tmp_path / "both.jsonl", {"prompt": "p", "image": "here.png", "source_image": "here.png"})
    with pytest.raises(PromptFileError, match=r"row 1: both 'source_image' and 'image' are given"):
        read_prompt_file(str(both))


def test_verl_omni_edit_rows_reach_the_edit_rewards(tmp_path):
    import numpy as np

    from omni_rl.reward import build_reward

    items = read_prompt_file(str(_verl_edit_parquet(tmp_path / "train.parquet", ["make it brighter"])))
    # The edit is the source itself (a 4 x 3 black picture): nothing changed, nothing brighter.
    edit = np.zeros((1, 3, 4, 3), np.uint8)
    prompts, metadata = [items[0].prompt], [items[0].metadata]
    assert build_reward("source_consistency")(edit, prompts, metadata) == [1.0]
    assert build_reward("edit_brightness")(edit, prompts, metadata) == [0.0]

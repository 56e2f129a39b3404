"""Dataset inputs refused at load with one line (issue 29, items 7 to 10 and a part of 15):
identical preference pairs, pair images checked at load, decompression bombs, bare base64,
paths confined to the data file's folder, a null source image, a folder or device as an image."""
import base64
import io
import json
import logging
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from omni_rl.compose import load_config
from omni_rl.data import dataset_folder
from omni_rl.data.chat_prompts import load_chat_items
from omni_rl.data.edit_prompts import load_edit_items
from omni_rl.data.preference_file import PreferenceFileError, load_preference_file
from omni_rl.data.prompt_item import PromptFileError
from omni_rl.data.prompts import check_prompt_sources


def _jsonl(path, *rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def _png(path, value, size=(24, 20)):
    Image.fromarray(np.full((size[1], size[0], 3), value, dtype=np.uint8)).save(path)
    return path.name


def _png_claiming(width, height):
    """A PNG whose header states width x height: PIL reads the size from it before any pixel."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


# -- item 7: identical preference pairs -------------------------------------------------------


def test_a_pair_of_one_file_is_refused_naming_the_row(tmp_path):
    w, l = _png(tmp_path / "w.png", 200), _png(tmp_path / "l.png", 20)
    rows = [{"prompt": "a", "chosen": w, "rejected": l}, {"prompt": "b", "chosen": w, "rejected": "./" + w}]
    with pytest.raises(PreferenceFileError, match=r"pairs.jsonl, row 2: 'chosen' and 'rejected' are the same file"):
        load_preference_file(_jsonl(tmp_path / "pairs.jsonl", *rows))


def test_a_pair_of_the_same_pixels_in_two_files_is_refused(tmp_path):
    w, copy = _png(tmp_path / "w.png", 77), _png(tmp_path / "copy.png", 77)
    with pytest.raises(PreferenceFileError, match=r"row 1: 'chosen' \('w.png'\) and 'rejected' \('copy.png'\) hold the same pixels"):
        load_preference_file(_jsonl(tmp_path / "pairs.jsonl", {"prompt": "a", "chosen": w, "rejected": copy}))


# -- item 8: pair images checked at load, pixels capped ---------------------------------------


def test_every_pair_image_is_decoded_at_load_not_when_drawn(tmp_path):
    w, l = _png(tmp_path / "w.png", 1), _png(tmp_path / "l.png", 2)
    full = (tmp_path / "full.png")
    full.write_bytes(open(tmp_path / "w.png", "rb").read()[:60])  # a valid header, truncated pixels
    rows = [{"prompt": "a", "chosen": w, "rejected": l}] * 3 + [{"prompt": "b", "chosen": w, "rejected": "full.png"}]
    with pytest.raises(PreferenceFileError, match=r"row 4: field 'rejected': .*full.png is not a readable image"):
        load_preference_file(_jsonl(tmp_path / "pairs.jsonl", *rows))


@pytest.mark.parametrize("width, height", [(9000, 9000), (40000, 40000)])  # over our cap; over PIL's bomb bound
def test_an_image_over_the_pixel_cap_is_one_line(tmp_path, width, height):
    (tmp_path / "bomb.png").write_bytes(_png_claiming(width, height))
    w = _png(tmp_path / "w.png", 1)
    with pytest.raises(PreferenceFileError, match=r"row 1: field 'rejected': .*bomb.png .*cap of 67,108,864") as err:
        load_preference_file(_jsonl(tmp_path / "pairs.jsonl", {"prompt": "a", "chosen": w, "rejected": "bomb.png"}))
    assert "\n" not in str(err.value)
    with pytest.raises(PromptFileError, match=r"images\[0\]: .*cap of 67,108,864"):
        load_chat_items(_jsonl(tmp_path / "chat.jsonl", {"prompt": "x", "images": ["bomb.png"]}))


# -- item 9: bare base64 ----------------------------------------------------------------------


def test_bare_base64_of_a_real_image_is_decoded_without_touching_the_filesystem(tmp_path):
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buffer, "PNG")
    text = base64.b64encode(buffer.getvalue()).decode()
    assert len(text) > 4096  # longer than any path, as a real image's base64 is
    (item,) = load_chat_items(_jsonl(tmp_path / "d.jsonl", {"prompt": "x", "images": [text]}))
    assert item.media["images"][0].size == (32, 32)
    (edit,) = load_edit_items(_jsonl(tmp_path / "e.jsonl", {"instruction": "x", "source_image": text}))
    assert edit.metadata["source_image"].size == (32, 32)


def test_a_string_neither_path_nor_base64_is_one_line(tmp_path):
    text = "not base64 ." * 1000
    with pytest.raises(PromptFileError, match=r"images\[0\]: .* is neither an image path .* nor base64"):
        load_chat_items(_jsonl(tmp_path / "d.jsonl", {"prompt": "x", "images": [text]}))


# -- item 10: paths confined to the data file's folder ----------------------------------------


@pytest.fixture
def outside(tmp_path):
    """tmp_path/data holds the data file; tmp_path/secret.png lies outside it."""
    (tmp_path / "data").mkdir()
    _png(tmp_path / "secret.png", 9)
    return tmp_path


@pytest.mark.parametrize("path, how", [("../secret.png", "climbs out of it with .."),
                                       ("ABSOLUTE", "is absolute"), ("link.png", "leaves it through a symlink")])
def test_paths_out_of_the_folder_are_refused(outside, path, how):
    os.symlink(outside / "secret.png", outside / "data" / "link.png")
    path = str(outside / "secret.png") if path == "ABSOLUTE" else path
    data = outside / "data"
    message = rf"file '{path}' is outside the data file's folder .*\(the path {how}.*set data.allow_paths_outside=true"
    with pytest.raises(PromptFileError, match=r"row 1: images\[0\]: " + message):
        load_chat_items(_jsonl(data / "chat.jsonl", {"prompt": "x", "images": [path]}))
    with pytest.raises(PromptFileError, match=r"row 1: source_image: " + message):
        load_edit_items(_jsonl(data / "edit.jsonl", {"instruction": "x", "source_image": {"path": path}}))
    _png(data / "w.png", 1)
    with pytest.raises(PreferenceFileError, match=r"row 1: field 'rejected': " + message):
        load_preference_file(_jsonl(data / "pairs.jsonl", {"prompt": "a", "chosen": "w.png", "rejected": path}))
    with pytest.raises(PromptFileError, match=r"audio\[0\]: " + message.replace("secret.png", "secret.wav")):
        load_chat_items(_jsonl(data / "audio.jsonl", {"prompt": "x", "audio": [path.replace("secret.png", "secret.wav")]}))


def test_the_opt_in_reads_outside_paths_and_says_so_once(outside, monkeypatch, caplog):
    monkeypatch.setattr(dataset_folder, "_said_outside", False)
    data = outside / "data"
    rows = [{"prompt": "x", "images": ["../secret.png"]}, {"prompt": "y", "images": [str(outside / "secret.png")]}]
    with caplog.at_level(logging.WARNING, logger="omni_rl.data.dataset_folder"):
        items = load_chat_items(_jsonl(data / "chat.jsonl", *rows), allow_outside=True)
        load_chat_items(data / "chat.jsonl", allow_outside=True)
    assert [item.media["images"][0].getpixel((0, 0)) for item in items] == [(9, 9, 9)] * 2
    said = [r.getMessage() for r in caplog.records if "outside the data file's folder" in r.getMessage()]
    assert len(said) == 1 and "data.allow_paths_outside=true" in said[0]


def test_the_config_key_reaches_the_readers(outside):
    data = outside / "data"
    _jsonl(data / "chat.jsonl", {"prompt": "x", "images": ["../secret.png"]})
    cfg = load_config(["recipe=tiny_qwen3_grpo", "data.prompts=null", f"data.prompt_file={data / 'chat.jsonl'}"])
    assert cfg.data.allow_paths_outside is False
    with pytest.raises(PromptFileError, match="outside the data file's folder"):
        check_prompt_sources(cfg.data)
    cfg = load_config(["recipe=tiny_qwen3_grpo", "data.prompts=null", f"data.prompt_file={data / 'chat.jsonl'}", "data.allow_paths_outside=true"])
    ((_, items),) = check_prompt_sources(cfg.data)
    assert items[0].media["images"][0].getpixel((0, 0)) == (9, 9, 9)


# -- item 15: a null source image, a folder or a device as an image ----------------------------


def test_a_null_source_image_says_null(tmp_path):
    with pytest.raises(PromptFileError, match=r"row 1: 'source_image' is null"):
        load_edit_items(_jsonl(tmp_path / "e.jsonl", {"instruction": "x", "source_image": None}))


@pytest.mark.parametrize("name, kind", [("sub", "a folder"), ("dev", "a device or other special file")])
def test_a_folder_or_device_is_not_a_file(tmp_path, name, kind):
    (tmp_path / "sub").mkdir()
    os.symlink("/dev/zero", tmp_path / "dev")  # inside the folder by name; its target is checked with the opt-in
    with pytest.raises(PromptFileError, match=rf"source_image: '{name}' is {kind}, not a file"):
        load_edit_items(_jsonl(tmp_path / "e.jsonl", {"instruction": "x", "source_image": name}), allow_outside=True)

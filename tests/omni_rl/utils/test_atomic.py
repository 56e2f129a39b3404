"""Atomic writes: the target is old or new, never half, and no temp file is left behind."""
import json
import os

import pytest
import torch
from PIL import Image

from omni_rl.utils.atomic import (
    atomic_directory,
    atomic_save_image,
    atomic_torch_save,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
)


class Boom(Exception):
    pass


def _names(directory):
    return sorted(os.listdir(directory))


def test_write_bytes_text_json_roundtrip(tmp_path):
    atomic_write_bytes(tmp_path / "a.bin", b"\x00\x01")
    atomic_write_text(tmp_path / "sub" / "b.txt", "héllo")  # parent is created
    atomic_write_json(tmp_path / "c.json", {"b": 1, "a": [1, 2]})

    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "sub" / "b.txt").read_text(encoding="utf-8") == "héllo"
    text = (tmp_path / "c.json").read_text()
    assert text == json.dumps({"a": [1, 2], "b": 1}, indent=2, sort_keys=True) + "\n"
    assert _names(tmp_path) == ["a.bin", "c.json", "sub"]


def test_overwrite_replaces_content(tmp_path):
    path = tmp_path / "f.txt"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert _names(tmp_path) == ["f.txt"]


def test_file_mode_follows_umask_not_tempfile(tmp_path):
    path = atomic_write_text(tmp_path / "f.txt", "x")
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_exception_mid_write_keeps_old_file_and_no_temp(tmp_path):
    path = tmp_path / "model.pt"
    atomic_torch_save({"w": torch.ones(2)}, path)

    class Exploding:
        def __reduce__(self):  # runs while torch.save is writing the temp file
            raise Boom("mid-write")

    with pytest.raises(Boom):
        atomic_torch_save({"w": torch.zeros(2), "bad": Exploding()}, path)

    assert torch.equal(torch.load(path)["w"], torch.ones(2))
    assert _names(tmp_path) == ["model.pt"]


def test_json_that_cannot_encode_touches_nothing(tmp_path):
    path = tmp_path / "c.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert _names(tmp_path) == ["c.json"]


def test_wrong_types_are_rejected(tmp_path):
    with pytest.raises(TypeError, match="atomic_write_text"):
        atomic_write_bytes(tmp_path / "a", "text")
    with pytest.raises(TypeError, match="atomic_write_bytes"):
        atomic_write_text(tmp_path / "a", b"bytes")
    assert _names(tmp_path) == []


def test_save_image_format_from_extension(tmp_path):
    image = Image.new("RGB", (4, 3), (10, 20, 30))
    atomic_save_image(image, tmp_path / "x.png")
    atomic_save_image(image, tmp_path / "x.jpg", quality=95)
    with Image.open(tmp_path / "x.png") as png:
        assert png.format == "PNG" and png.size == (4, 3)
    with Image.open(tmp_path / "x.jpg") as jpg:
        assert jpg.format == "JPEG"
    with pytest.raises(ValueError, match="extension"):
        atomic_save_image(image, tmp_path / "x.nope")
    assert _names(tmp_path) == ["x.jpg", "x.png"]


def test_directory_success_replaces_existing(tmp_path):
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "old.txt").write_text("old")

    with atomic_directory(target) as tmp_dir:
        assert tmp_dir.parent == tmp_path and tmp_dir != target
        (tmp_dir / "new.txt").write_text("new")
        (tmp_dir / "nested").mkdir()
        (tmp_dir / "nested" / "x.txt").write_text("x")
        assert (target / "old.txt").exists()  # untouched until the block ends

    assert _names(target) == ["nested", "new.txt"]
    assert _names(tmp_path) == ["ckpt"]  # no temp dir, no backup left


def test_directory_exception_leaves_target_untouched(tmp_path):
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "old.txt").write_text("old")

    with pytest.raises(Boom):
        with atomic_directory(target) as tmp_dir:
            (tmp_dir / "half.txt").write_text("half")
            raise Boom

    assert _names(target) == ["old.txt"]
    assert _names(tmp_path) == ["ckpt"]


def test_directory_new_target_and_failure_without_target(tmp_path):
    with pytest.raises(Boom):
        with atomic_directory(tmp_path / "a"):
            raise Boom
    assert _names(tmp_path) == []

    with atomic_directory(tmp_path / "a") as tmp_dir:
        (tmp_dir / "f").write_text("1")
    assert (tmp_path / "a" / "f").read_text() == "1"
    assert _names(tmp_path) == ["a"]


def test_directory_target_that_is_a_file_is_rejected(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        with atomic_directory(tmp_path / "f"):
            pass
    assert _names(tmp_path) == ["f"]

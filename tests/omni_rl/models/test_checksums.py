"""SHA256SUMS checks (omni_rl/models/checksums.py) and the loader's use of them: a good folder
passes, and a changed, missing, unlisted or malformed entry fails with the file named."""
import pytest

from omni_rl.models.checksums import ChecksumError, read_checksums, verify_checksums, write_checksums
from omni_rl.models.loading import ModelFolderError, check_model_folder, packaged_model_folder
from omni_rl.models.registry import register_packaged_model


def _folder(tmp_path):
    (tmp_path / "m" / "sub").mkdir(parents=True)
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "m" / "sub" / "w.safetensors").write_bytes(b"\x00" * 100)
    write_checksums(tmp_path / "m")
    return tmp_path / "m"


def test_written_checksums_verify_and_list_every_file(tmp_path):
    folder = _folder(tmp_path)
    assert set(read_checksums(folder)) == {"config.json", "model.safetensors", "sub/w.safetensors"}
    # sha256 of 100 zero bytes, computed independently of the module (sha256sum)
    assert read_checksums(folder)["sub/w.safetensors"] == "cd00e292c5970d3c5e2f0ffa5171e555bc46bfc4faddfb4a418b6840b86e79a3"
    verify_checksums(folder, "fix it")


def test_a_changed_byte_fails_naming_the_file(tmp_path):
    folder = _folder(tmp_path)
    data = bytearray((folder / "sub" / "w.safetensors").read_bytes())
    data[50] = 1
    (folder / "sub" / "w.safetensors").write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"w\.safetensors fails its checksum.*fix it"):
        verify_checksums(folder, "fix it")


def test_an_unchanged_verified_folder_is_not_hashed_again_and_a_changed_one_is(tmp_path, monkeypatch):
    from omni_rl.models import checksums

    folder = _folder(tmp_path)
    hashed = []
    real = checksums.sha256_of
    monkeypatch.setattr(checksums, "sha256_of", lambda f: hashed.append(f.name) or real(f))
    verify_checksums(folder, "fix it")
    assert sorted(hashed) == ["config.json", "model.safetensors", "w.safetensors"]
    hashed.clear()
    verify_checksums(folder, "fix it")
    assert hashed == []  # the command line's check, then the loader's: hashed once
    (folder / "sub" / "w.safetensors").write_bytes(b"\x01" * 100)  # same size, new mtime
    with pytest.raises(ChecksumError, match=r"w\.safetensors fails its checksum"):
        verify_checksums(folder, "fix it")
    assert "w.safetensors" in hashed


def test_missing_extra_and_malformed_entries_fail(tmp_path):
    folder = _folder(tmp_path)
    (folder / "extra.bin").write_bytes(b"x")
    with pytest.raises(ChecksumError, match=r"extra\.bin is not listed"):
        verify_checksums(folder, "fix")
    (folder / "extra.bin").unlink()
    (folder / "config.json").unlink()
    with pytest.raises(ChecksumError, match=r"config\.json is missing"):
        verify_checksums(folder, "fix")
    (folder / "SHA256SUMS").write_text("not a checksum line\n")
    with pytest.raises(ChecksumError, match="line 1"):
        verify_checksums(folder, "fix")
    (folder / "SHA256SUMS").unlink()
    with pytest.raises(ChecksumError, match="SHA256SUMS is missing"):
        verify_checksums(folder, "fix")


def test_the_loader_checks_local_and_packaged_folders(tmp_path):
    folder = _folder(tmp_path)
    check_model_folder(folder, str(folder))
    (folder / "sub" / "w.safetensors").write_bytes(b"\x01" * 100)
    with pytest.raises(ModelFolderError, match=r"w\.safetensors fails its checksum"):
        check_model_folder(folder, str(folder))
    check_model_folder(folder, str(folder), weights=False)  # a weightless view reads no weight file
    register_packaged_model("test_checksums_corrupted", folder)
    with pytest.raises(ModelFolderError, match=r"tiny:test_checksums_corrupted.*w\.safetensors fails its checksum"):
        packaged_model_folder("test_checksums_corrupted")
    assert packaged_model_folder("sd3") is None  # a tiny builder's name, not a packaged model

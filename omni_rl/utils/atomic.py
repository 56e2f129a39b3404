"""Atomic file and directory writes: a reader sees the old content or the new, never half.

A temporary beside the target is written, fsynced and `os.replace`d onto it; on an error the
target is untouched. `with atomic_directory(checkpoint_dir) as tmp: ...` renames on success.
Left out on purpose: locking (the trainer writes from rank 0 only).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Iterator

# The process umask, read once: os.umask can only be read by setting it, so do it at import
# (single-threaded) rather than on every write.
_UMASK = os.umask(0)
os.umask(_UMASK)

_TMP_SUFFIX = ".tmp"
_OLD_SUFFIX = ".old"
# `.TARGET.XXXXXXXX.tmp` / `.old`: `tempfile` fills XXXXXXXX with 8 of these characters.
_LEFTOVER = re.compile(r"^\.(?P<target>.+)\.[a-z0-9_]{8}(?P<suffix>\.tmp|\.old)$")


def _tmp_prefix(path: Path) -> str:
    # A leading dot hides the half-written file from globs such as `ckpt/*.pt`.
    return f".{path.name}."


def leftover_of(name: str) -> tuple[str, str] | None:
    """`(target, kind)` when `name` is one of these writers' temporaries for `target`, else None: kind
    "tmp" (never complete) or "old" (the complete previous content of a directory being replaced,
    the only copy if the writer died between its two renames).
    """
    match = _LEFTOVER.match(name)
    if match is None:
        return None
    return match.group("target"), "tmp" if match.group("suffix") == _TMP_SUFFIX else "old"


def _fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable. Not possible on Windows; skipped there."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    """Run `write(f)` on a temporary sibling file, then rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=_TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, 0o666 & ~_UMASK)
        os.replace(tmp_name, path)
    except BaseException:
        # BaseException too: a Ctrl-C mid-write must not leave a stray temp file.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically; returns the path."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"atomic_write_bytes expects bytes, got {type(data).__name__}; "
            f"use atomic_write_text for str"
        )
    return _atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write `text` to `path` atomically (UTF-8 by default); returns the path."""
    if not isinstance(text, str):
        raise TypeError(
            f"atomic_write_text expects str, got {type(text).__name__}; "
            f"use atomic_write_bytes for bytes"
        )
    return _atomic_write(path, lambda f: f.write(text.encode(encoding)))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write `obj` as JSON (indent 2, sorted keys, trailing newline) atomically.

    The object is serialised before the temporary file is created, so an object that JSON
    cannot encode raises without touching the disk at all.
    """
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    return atomic_write_text(path, text)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """`torch.save(obj, path)`, atomically. Argument order follows `torch.save`."""
    import torch  # imported here so that the text/json helpers do not pull in torch

    return _atomic_write(path, lambda f: torch.save(obj, f))


def atomic_save_safetensors(tensors: dict, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> Path:
    """`safetensors.torch.save_file(tensors, path)`, atomically.

    The file is serialised in memory first (safetensors writes only to a named file or to
    bytes), so a tensor it cannot store raises before the disk is touched.
    """
    from safetensors.torch import save

    return atomic_write_bytes(path, save(tensors, metadata=metadata))


def atomic_save_image(pil_image: Any, path: str | os.PathLike, **save_kwargs: Any) -> Path:
    """`pil_image.save(path)`, atomically; the format comes from the extension of `path`.

    `save_kwargs` go to `PIL.Image.Image.save` (e.g. `quality=90` for JPEG).
    """
    from PIL import Image

    if not isinstance(pil_image, Image.Image):
        raise TypeError(
            f"atomic_save_image expects a PIL.Image.Image, got {type(pil_image).__name__}; "
            f"convert arrays with PIL.Image.fromarray(uint8_hwc_array)"
        )
    path = Path(path)
    # The temporary file ends in .tmp, so PIL cannot guess the format from its name: look it
    # up from the real target's extension, before any file is created.
    image_format = Image.registered_extensions().get(path.suffix.lower())
    if image_format is None:
        raise ValueError(
            f"cannot tell the image format of {str(path)!r} from its extension {path.suffix!r}; "
            f"use an extension such as .png or .jpg"
        )
    return _atomic_write(path, lambda f: pil_image.save(f, format=image_format, **save_kwargs))


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root`, so the rename publishes durable data."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            file_path = os.path.join(dirpath, name)
            if os.path.islink(file_path):
                continue
            fd = os.open(file_path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _usual_modes(root: Path) -> None:
    """Give `root`, and every folder and file under it, the mode `mkdir` / `open` would under
    the umask (0o777 / 0o666 minus it; executables keep their x bits). Libraries that write
    through a temporary file hand back 0o600 files (safetensors' `save_file`), which other users
    of a shared output folder could not read."""
    os.chmod(root, 0o777 & ~_UMASK)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            entry = os.path.join(dirpath, name)
            if os.path.islink(entry):
                continue
            executable = os.path.isdir(entry) or os.stat(entry).st_mode & 0o111
            os.chmod(entry, (0o777 if executable else 0o666) & ~_UMASK)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success, it becomes `path`.

    On a normal exit its files are fsynced and it is renamed onto `path`; on an exception it is
    deleted and `path` untouched. Replacing an existing directory takes two renames (old -> backup,
    new -> `path`): a crash between them leaves the old content in `.NAME.*.old`, which the next
    run renames back.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(
            f"atomic_directory target {str(path)!r} exists and is not a directory; "
            f"remove it or choose another path"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=_tmp_prefix(path), suffix=_TMP_SUFFIX, dir=path.parent))
    try:
        yield tmp_dir
        _usual_modes(tmp_dir)
        _fsync_tree(tmp_dir)
        _replace_directory(tmp_dir, path)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    _fsync_dir(path.parent)


def _replace_directory(new_dir: Path, path: Path) -> None:
    """Rename `new_dir` onto `path`, moving an existing `path` aside first and deleting it last."""
    if not path.exists():
        os.replace(new_dir, path)
        return
    backup = Path(tempfile.mkdtemp(prefix=_tmp_prefix(path), suffix=_OLD_SUFFIX, dir=path.parent))
    os.rmdir(backup)  # mkdtemp only reserved a unique name; the rename needs it absent
    os.replace(path, backup)
    try:
        os.replace(new_dir, path)
    except BaseException:
        os.replace(backup, path)  # put the old directory back: `path` must stay untouched
        raise
    shutil.rmtree(backup, ignore_errors=True)

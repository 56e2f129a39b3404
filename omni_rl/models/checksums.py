"""SHA256SUMS files: what a shipped model folder holds, and the check that it still does.

`write_checksums` writes one (`sha256sum`'s format); `verify_checksums` checks every file is
listed and matches (re-hashing only on a size or mtime change); `sha256_of` hashes one file.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from omni_rl.utils.atomic import atomic_write_text

SUMS_FILE = "SHA256SUMS"


class ChecksumError(OSError):
    """A file of a checksummed folder is missing, extra, or does not match its checksum."""


def sha256_of(file: Path) -> str:
    """The file's sha256 as hex, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _listed_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != SUMS_FILE)


def write_checksums(folder: str | Path) -> Path:
    """Write `folder/SHA256SUMS` over every other file in it; returns its path."""
    folder = Path(folder)
    lines = [f"{sha256_of(f)}  {f.relative_to(folder).as_posix()}" for f in _listed_files(folder)]
    return atomic_write_text(folder / SUMS_FILE, "\n".join(lines) + "\n")


def read_checksums(folder: str | Path) -> dict[str, str]:
    """{relative path: sha256} from `folder/SHA256SUMS`."""
    file = Path(folder) / SUMS_FILE
    sums = {}
    for n, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            raise ChecksumError(f"{file} line {n} is {line!r}; expected '<64 hex digits>  <path>' (as sha256sum writes)")
        sums[name] = digest.lower()
    return sums


# Folder (resolved) -> the fingerprint it had when it last verified in this process.
_VERIFIED: dict[Path, tuple] = {}


def _fingerprint(folder: Path) -> tuple:
    files = [folder / SUMS_FILE, *_listed_files(folder)]
    return tuple((f.relative_to(folder).as_posix(), f.stat().st_size, f.stat().st_mtime_ns) for f in files)


def verify_checksums(folder: str | Path, fix: str) -> None:
    """Raise `ChecksumError` naming the first file of `folder` that is missing, unlisted, or
    differs from its checksum; `fix` says in the message how to get a good copy back. A folder
    this process verified and that has not changed since is not hashed again (module docstring)."""
    folder = Path(folder)
    if not (folder / SUMS_FILE).is_file():
        raise ChecksumError(f"{folder / SUMS_FILE} is missing (no checksums, so no check of the model's files); {fix}")
    key, seen = folder.resolve(), _fingerprint(folder)
    if _VERIFIED.get(key) == seen:
        return
    _verify(folder, fix)
    _VERIFIED[key] = seen


def _verify(folder: Path, fix: str) -> None:
    sums = read_checksums(folder)
    present = {f.relative_to(folder).as_posix() for f in _listed_files(folder)}
    for name, expected in sorted(sums.items()):
        file = folder / name
        if name not in present:
            raise ChecksumError(f"{file} is missing: {folder / SUMS_FILE} lists it; {fix}")
        actual = sha256_of(file)
        if actual != expected:
            raise ChecksumError(
                f"{file} fails its checksum: sha256 {actual}, expected {expected} (from {folder / SUMS_FILE}); "
                f"the file is corrupted or was changed; {fix}"
            )
    extra = sorted(present - set(sums))
    if extra:
        raise ChecksumError(f"{folder / extra[0]} is not listed in {folder / SUMS_FILE}; remove it, or {fix}")

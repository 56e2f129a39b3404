"""Where the files a dataset names may be, and what a string in an image field is.

`DatasetFolder.file(value, where)` resolves a path relative to the data file's folder and
refuses one outside it (unless `data.allow_paths_outside=true`), a missing one or a non-file;
`is_base64(text)` spots inline images. Not here: reading files, URLs (never fetched).
"""
from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from omni_rl.data.prompt_item import PromptFileError

logger = logging.getLogger(__name__)

# Shorter base64 strings are too short to be an image, and might be a file's name.
MIN_BASE64_CHARS = 64
# The longest path string taken as a path (Linux's PATH_MAX); longer ones are refused as such.
MAX_PATH_CHARS = 4096
_BASE64_RE = re.compile(r"[A-Za-z0-9+/\s]+={0,2}")
OPT_IN = "data.allow_paths_outside=true"

_said_outside = False  # the opt-in's warning is said once per process, not once per path


def is_base64(text: str) -> bool:
    """Whether an image string is bare base64 (its alphabet alone, `MIN_BASE64_CHARS` or more); no filesystem access."""
    return len(text) >= MIN_BASE64_CHARS and _BASE64_RE.fullmatch(text) is not None


class MissingFileError(PromptFileError):
    """A dataset path that names nothing."""


@dataclass(frozen=True)
class DatasetFolder:
    """A data file's folder: the root its relative paths resolve in and may not leave unless
    `allow_outside` (`data.allow_paths_outside`)."""

    root: Path
    allow_outside: bool = False

    def file(self, value: str, where: str, label: str = "file") -> Path:
        """The regular file `value` names (relative to `root`); `where` ("FILE: row N: field")
        prefixes every error and `label` names the value in them ("file", "image path"). Raises
        `PromptFileError` for the cases in the module docstring (`MissingFileError` for a path
        that does not exist)."""
        if len(value) > MAX_PATH_CHARS or "\x00" in value:
            raise PromptFileError(
                f"{where}: {_short(value)} is neither an image path (over {MAX_PATH_CHARS} characters or a NUL "
                f"byte) nor base64 (at least {MIN_BASE64_CHARS} characters of A-Z a-z 0-9 + / =); give a path "
                f"relative to the data file's folder, base64 or a data: URI"
            )
        given = Path(value).expanduser()
        path = given if given.is_absolute() else self.root / given
        try:
            real, root = path.resolve(), self.root.resolve()
        except (OSError, RuntimeError) as err:  # a symlink loop, a component too long
            raise PromptFileError(f"{where}: file {value!r} cannot be resolved ({err})") from None
        if not real.is_relative_to(root):
            if not self.allow_outside:
                how = ("is absolute" if given.is_absolute() else "leaves it through a symlink"
                       if _lexically_inside(given) else "climbs out of it with ..")
                raise PromptFileError(
                    f"{where}: file {value!r} is outside the data file's folder {root} (the path {how}; it "
                    f"resolves to {real}); paths must stay inside that folder: move the file there, or set "
                    f"{OPT_IN} to read files anywhere"
                )
            _say_outside(value, real, where)
        try:
            mode = os.stat(real).st_mode
        except FileNotFoundError:
            raise MissingFileError(
                f"{where}: {label} {value!r} does not exist (looked for {path}); paths are relative to the data "
                f"file's folder"
            ) from None
        except OSError as err:
            raise PromptFileError(f"{where}: file {value!r} cannot be read ({err.strerror})") from None
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a device or other special file"
            raise PromptFileError(f"{where}: {value!r} is {kind}, not a file; expected an image or audio file")
        return real


def _lexically_inside(given: Path) -> bool:
    """Whether relative path `given` stays inside its root by its text alone (no `..` above it)."""
    depth = 0
    for part in given.parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return False
    return True


def _say_outside(value: str, real: Path, where: str) -> None:
    global _said_outside
    if not _said_outside:
        _said_outside = True
        logger.warning("%s: reading %r (%s) from outside the data file's folder, as %s allows; this is said "
                       "once, for the first such path", where, value, real, OPT_IN)


def _short(value: str, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(value)} characters)"

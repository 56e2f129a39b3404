"""Token files: a server's secret in a file that only its owner can read, bound to its URL.

    {"url": "http://127.0.0.1:8000", "token": "<at least 16 characters>"}

Mode 0600; a client sends the token only to that URL's origin (`same_origin`). Left out:
encrypting the file, key rotation (delete it and restart the server).
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
import urllib.parse
from dataclasses import dataclass
from typing import Optional

MIN_TOKEN_CHARS = 16
MAX_FILE_BYTES = 64 << 10  # a token file is a few hundred bytes; anything larger is not one
DEFAULT_PORTS = {"http": 80, "https": 443}


class TokenFileError(ValueError):
    """A token file that cannot be used (missing, readable by others, malformed); the message
    names the path, what is wrong and what to do."""


@dataclass(frozen=True)
class TokenFile:
    path: str
    token: str
    url: Optional[str]  # the server the token is for; None in a file that does not name one


def check_private(path: str, fd: int) -> None:
    """Raise TokenFileError unless the open file `fd` at `path` is a regular file of this user
    with no permission bit for the group or others."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise TokenFileError(f"token file {path!r} is not a regular file; expected a file of mode 0600")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise TokenFileError(
            f"token file {path!r} has mode {mode:04o}: other local users can read the token; expected 0600 "
            f"(run: chmod 600 {path}, and make a new token if others may have read it)"
        )
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise TokenFileError(
            f"token file {path!r} belongs to uid {info.st_uid}, not to this user ({os.getuid()}); expected a "
            f"file of your own, mode 0600"
        )


def read_token_file(path: str) -> TokenFile:
    """The token (and the URL it is for) in `path`; raise TokenFileError naming what is wrong."""
    path = os.path.expanduser(os.fspath(path))
    try:
        # O_NOFOLLOW: the mode checked is the file's, not a symlink's that points elsewhere.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise TokenFileError(f"token file {path!r} does not exist; expected the file its server wrote "
                             f"(python -m omni_rl.reward.server ... --token-file {path})") from None
    except OSError as err:
        raise TokenFileError(f"token file {path!r} cannot be opened ({err.strerror or err}); expected a "
                             f"file of your own, mode 0600") from None
    try:
        check_private(path, fd)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise TokenFileError(f"token file {path!r} is larger than {MAX_FILE_BYTES} bytes; expected one JSON "
                             f"object {{\"url\": ..., \"token\": ...}}")
    try:
        content = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        content = None
    if not isinstance(content, dict) or not isinstance(content.get("token"), str):
        raise TokenFileError(f"token file {path!r} is not a JSON object with a \"token\" string; expected "
                             f"{{\"url\": \"http://127.0.0.1:8000\", \"token\": \"...\"}}")
    token, url = content["token"], content.get("url")
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenFileError(f"token file {path!r} holds a token of {len(token)} characters; expected at least "
                             f"{MIN_TOKEN_CHARS} (delete the file and let the server write a fresh one)")
    if url is not None and not isinstance(url, str):
        raise TokenFileError(f"token file {path!r}: \"url\" is a {type(url).__name__}; expected the server's "
                             f"base URL as a string")
    return TokenFile(path, token, url)


def write_token_file(path: Optional[str], token: str, url: str, *, prefix: str = "omni-rl-token-") -> str:
    """Write a new token file (mode 0600) at `path`, or at a fresh name in the temporary
    directory when `path` is None; return its path. An existing file is never overwritten."""
    body = json.dumps({"url": url, "token": token}).encode() + b"\n"
    if path is None:
        fd, path = tempfile.mkstemp(prefix=prefix, suffix=".json")  # created 0600
    else:
        path = os.path.expanduser(os.fspath(path))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, body)
    finally:
        os.close(fd)
    return path


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of `url`, the port filled in from the scheme when absent."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or DEFAULT_PORTS.get(scheme, 0)


def same_origin(a: str, b: str) -> bool:
    """True when `a` and `b` name the same server (scheme, host and port)."""
    try:
        return origin(a) == origin(b)
    except ValueError:  # a bad port
        return False

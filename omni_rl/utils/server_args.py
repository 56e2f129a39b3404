"""The command-line scaffolding both servers share (`python -m omni_rl.reward.server`,
`python -m omni_rl.rollout.server`): one-line parser errors, the transport's options, the
token's ways in, and start-up failures as one `error:` line (exit 2 bad input, 1 run-time).
Left out: what each server takes besides and prints once it serves.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
from typing import Callable, NoReturn, Optional, Sequence

from omni_rl.utils.http_transport import (
    DEFAULT_HEADER_DEADLINE_S,
    DEFAULT_MAX_CONNECTIONS,
    bind_error,
    check_server_limits,
)
from omni_rl.utils.token_files import TokenFile, TokenFileError, read_token_file, write_token_file


class ServerStartError(SystemExit):
    """The command line cannot start its server: `run_main` prints `error: <message>` (one line)
    and exits with `code`, 2 for bad input and 1 for a run-time failure."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(code)
        self.message = " ".join(message.splitlines())

    def __str__(self) -> str:
        return self.message


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are a `ServerStartError` (argparse prints its usage too)."""

    def error(self, message: str) -> NoReturn:
        raise ServerStartError(f"{message} (see {self.prog} --help)", 2)


def run_main(serve: Callable[[Optional[Sequence[str]]], int], argv: Optional[Sequence[str]]) -> int:
    """`serve(argv)`'s exit code, or a `ServerStartError`'s after its one `error:` line on stderr."""
    try:
        return serve(argv)
    except ServerStartError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.code)


def add_transport_options(parser: argparse.ArgumentParser, max_body_bytes: int) -> None:
    """--max-body-bytes, --header-deadline-s and --max-connections: the transport's bounds."""
    parser.add_argument("--max-body-bytes", type=positive_bytes, default=max_body_bytes,
                        help="the largest request body read (a larger one is answered 413)")
    parser.add_argument("--header-deadline-s", type=seconds, default=DEFAULT_HEADER_DEADLINE_S,
                        help="seconds a connection has to send its request headers, then it is closed")
    parser.add_argument("--max-connections", type=connections, default=DEFAULT_MAX_CONNECTIONS,
                        help="connections served at once that have not shown the token (more are answered 503)")


def take_env_token(name: str) -> Optional[str]:
    """The token in the environment variable `name` (None if unset), removed from the environment
    so that nothing the server starts inherits it."""
    return os.environ.pop(name, None) or None


def read_token_option(path: str) -> TokenFile:
    """The token file `--token-file` names, or a `ServerStartError` naming what is wrong with it."""
    try:
        return read_token_file(path)
    except TokenFileError as err:
        raise ServerStartError(f"--token-file: {err}", 2) from None


def write_token_option(path: Optional[str], token: str, url: str, prefix: str = "omni-rl-token-") -> str:
    """Write a fresh token file for the server at `url` (`write_token_file`); a `ServerStartError`
    when it cannot be written."""
    try:
        return write_token_file(path, token, url, prefix=prefix)
    except OSError as err:
        raise ServerStartError(f"--token-file {path!r}: cannot write it ({err.strerror or err}); give a path in a "
                               f"folder of your own", 2) from None


def bind_failure(host: str, port: int, err: OSError) -> ServerStartError:
    """The one line for a server that cannot listen: exit 1 for a port in use (taken now, at run
    time), 2 for an address or port this machine does not let it bind."""
    return ServerStartError(bind_error(host, port, err), 1 if err.errno == errno.EADDRINUSE else 2)


def port(text: str) -> int:
    """A TCP port 0..65535 (`--port`; 0 = a free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; expected a port 0..65535 (0 = a free one)") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is out of range; expected a port 0..65535 (0 = a free one)")
    return value


def positive_bytes(text: str) -> int:
    """A whole number of bytes >= 1 (`--max-body-bytes`)."""
    return _at_least_one(text, "bytes")


def connections(text: str) -> int:
    """A whole number of connections >= 1 (`--max-connections`)."""
    return _at_least_one(text, "connections")


def seconds(text: str) -> float:
    """A finite number of seconds > 0 (`--header-deadline-s`)."""
    try:
        value = float(text)
        check_server_limits(value, 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}; expected a finite number of seconds > 0") from None
    return value


def _at_least_one(text: str, unit: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}; expected a whole number of {unit} >= 1")
    return value

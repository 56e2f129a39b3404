"""argparse types shared by the two servers' command lines (`omni_rl.reward.server`, `omni_rl.rollout.server.serve`).

Each turns one flag's text into its value or raises `argparse.ArgumentTypeError` with the
expected kind, which argparse prints as the server's one-line usage error.
"""
from __future__ import annotations

import argparse

from omni_rl.utils.http_transport import check_server_limits


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

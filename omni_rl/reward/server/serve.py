"""`python -m omni_rl.reward.server --scorer SPEC`: build a scorer and serve it (`ScoreServer`).

    python -m omni_rl.reward.server --scorer latent_stats --port 8000 --token-file PATH

`--scorer` and `--kwargs` name the scorer (`omni_rl.reward.server.scorers`). The server binds
127.0.0.1 unless `--host` is given. The token comes from `OMNI_RL_REWARD_TOKEN` or a 0600
`--token-file` (written fresh when missing), never `--token`; token rules are in
docs/reward_protocol.md (Security). A bad command line prints one `error: ...` line and exits 2;
a run-time failure (port in use, the factory failed) exits 1.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import urllib.parse
from typing import Optional, Sequence

from omni_rl.reward.protocol import PROTOCOL_VERSION, TOKEN_ENV
from omni_rl.reward.server.app import DEFAULT_HOST, DEFAULT_MAX_BODY_BYTES, ScoreServer, describe_scorer, make_server
from omni_rl.reward.server.scorers import load_scorer
from omni_rl.utils import server_args
from omni_rl.utils.http_transport import new_token
from omni_rl.utils.server_args import ServerStartError
from omni_rl.utils.token_files import MIN_TOKEN_CHARS

logger = logging.getLogger(__name__)

# Raised by a factory handed options it cannot use (a bad value, a missing file): bad input.
_BAD_INPUT_ERRORS = (ValueError, TypeError, LookupError, ImportError, OSError)

# Where a token goes instead of the command line (which every local user reads: ps, /proc/PID/cmdline).
TOKEN_ADVICE = (f"put it in the environment variable {TOKEN_ENV}, or give --token-file PATH (a file of mode "
                f"0600; a PATH that does not exist is written with a fresh token and this server's URL)")


def server_from_args(argv: Sequence[str] | None = None) -> ScoreServer:
    """Parse the command line, build the scorer and bind the server (not yet serving).

    Raises `ServerStartError` (a SystemExit) with a one-line message for anything that stops
    the server from starting. `server.token_source` says where its token is (never the token
    itself), None without one.
    """
    parser = server_args.OneLineParser(prog="python -m omni_rl.reward.server", description=__doc__.split("\n\n")[0],
                                       allow_abbrev=False)  # no prefix of --token-file stands for it
    parser.add_argument(
        "--scorer", required=True, help="latent_stats | latent_reward_model | module:factory | reward:NAME"
    )
    parser.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for the factory")
    parser.add_argument(
        "--host", default=None,
        help=f"address to bind (default {DEFAULT_HOST}; any other address only when given here)",
    )
    parser.add_argument("--port", type=server_args.port, default=0, help="port to bind (0 = a free one, printed at start)")
    parser.add_argument(
        "--token-file", default=None, metavar="PATH",
        help=f"the token every request must carry as 'Authorization: Bearer TOKEN' (else 401), in a JSON file "
             f"{{\"url\": ..., \"token\": ...}} of mode 0600; a PATH that does not exist is written with a fresh "
             f"token. Default: ${TOKEN_ENV} when set, else no token",
    )
    parser.add_argument("--token", nargs="?", const="", default=None, metavar="(refused)",
                        help=f"refused: a token on the command line is visible to every local user; {TOKEN_ADVICE}")
    server_args.add_transport_options(parser, DEFAULT_MAX_BODY_BYTES)
    args = parser.parse_args(argv)
    if args.token is not None:  # its value is never repeated: it may be the secret
        parser.error(f"--token puts the secret on the command line, where every local user can read it (ps, "
                     f"/proc/PID/cmdline); {TOKEN_ADVICE}")
    host = DEFAULT_HOST if args.host is None else args.host
    token, token_source, write_to = _token_from(parser, args, host)
    try:
        kwargs = json.loads(args.kwargs)
    except ValueError as err:
        parser.error(
            f"--kwargs {args.kwargs!r} is not JSON ({err}); expected an object such as '{{\"seed\": 1}}'"
        )
    if not isinstance(kwargs, dict):
        parser.error(f"--kwargs {args.kwargs!r} is a JSON {type(kwargs).__name__}; expected an object")
    where = f"--scorer {args.scorer!r}" + (f" --kwargs {args.kwargs}" if kwargs else "")
    try:
        scorer = load_scorer(args.scorer, kwargs)
    except _BAD_INPUT_ERRORS as err:
        message = str(err)
        if not message.startswith("--scorer"):
            message = f"{where}: {type(err).__name__}: {message}"
        raise ServerStartError(message, 2) from err
    except Exception as err:  # the factory failed on its own (out of memory, a bug): run time
        raise ServerStartError(f"{where}: building the scorer failed: {type(err).__name__}: {err}", 1) from err
    # Only an explicit --host may bind a non-loopback address: the protocol has no encryption.
    try:
        server = make_server(
            scorer, host, args.port, allow_remote=args.host is not None, max_body_bytes=args.max_body_bytes,
            token=token, header_deadline_s=args.header_deadline_s, max_connections=args.max_connections,
        )
    except OSError as err:  # taken now (run time), or not an address to bind
        raise server_args.bind_failure(host, args.port, err) from err
    if write_to is not None:  # the URL is known once bound (--port 0)
        try:
            server_args.write_token_option(write_to, token, server.url)
        except ServerStartError:
            server.server_close()
            raise
    if server is not None:  # (a test's stand-in for make_server returns None)
        server.token_source = token_source
    return server


def _token_from(parser: argparse.ArgumentParser, args: argparse.Namespace,
                host: str) -> tuple[Optional[str], Optional[str], Optional[str]]:
    """(token, where it is for the user, the path to write it to) from --token-file or the
    environment; checked before the scorer loads."""
    from_env = server_args.take_env_token(TOKEN_ENV)
    if args.token_file is None:
        if from_env is not None and len(from_env) < MIN_TOKEN_CHARS:
            parser.error(f"${TOKEN_ENV} is {len(from_env)} characters; expected a secret of at least "
                         f"{MIN_TOKEN_CHARS} (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        return from_env, (f"the environment variable {TOKEN_ENV}" if from_env else None), None
    if from_env is not None:
        parser.error(f"both ${TOKEN_ENV} and --token-file are given; give the token one way (unset {TOKEN_ENV}, "
                     f"or leave out --token-file)")
    path = os.path.expanduser(args.token_file)
    if not os.path.lexists(path):
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            parser.error(f"--token-file {path!r}: the folder {folder!r} does not exist; give a path in a folder of "
                         f"your own (the server writes a fresh token there)")
        return new_token(), f"{path} (written now, mode 0600)", path
    found = server_args.read_token_option(path)
    if found.url is not None:
        bound = urllib.parse.urlsplit(found.url)
        if bound.hostname != host or bound.port != args.port:
            parser.error(f"--token-file {path!r} is for {found.url}, and this server would listen on {host}:"
                         f"{args.port or '(a free port)'}; start it with --host/--port of that URL, or delete the "
                         f"file to have a fresh token written for this address")
    return found.token, f"{path} (mode 0600)", None


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return server_args.run_main(_serve, argv)


def _serve(argv: Sequence[str] | None) -> int:
    server = server_from_args(argv)
    where = f"; token: {server.token_source}" if server.token_source else ""
    print(f"omni-rl reward server: {describe_scorer(server.scorer)} at {server.url} (protocol {PROTOCOL_VERSION})"
          f"{where}", flush=True)
    if server.token is None:
        logger.warning("serving without a token: any local process can score with this server "
                       "(set %s or give --token-file PATH)", TOKEN_ENV)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0

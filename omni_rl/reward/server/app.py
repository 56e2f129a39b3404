"""A reference server for the remote-scorer protocol (`omni_rl.reward.protocol`).

It serves any scorer callable

    scorer(tensor, prompts, metadata) -> list[float]        # one finite score per sample

where `tensor` is the request's float32 latents [B, ...] or uint8 images [B, H, W, C]
(a registered image reward such as `build_reward("brightness")` fits as it is). A scorer may
carry an attribute `accepts = "latents"` or `"images"`; the server then answers a request of
the other kind with 400. A scorer may raise `HttpStatusError(status, message)` to choose the
reply (e.g. 503 while its model is loading); a `RewardInputError` (the batch does not fit the
scorer, e.g. float images to an image reward) is a 400; any other exception is a 500 naming
it, and so is a wrong number of scores or a NaN/inf. Calls into the scorer are serialised by a lock (one
batch at a time), since a model on one device gains nothing from concurrent batches. The
transport (token check, body bound 413, timeouts for idle and trickling connections, a body
refused before it was read read and dropped so that the client sees the answer, not a reset)
is `omni_rl.utils.http_transport`'s, shared with the rollout server.

    python -m omni_rl.reward.server --scorer latent_stats --port 8000
    python -m omni_rl.reward.server --scorer my_pkg.scorers:make_scorer --kwargs '{"path": "m.st"}'
    python -m omni_rl.reward.server --scorer reward:jpeg_compressibility      # a registered reward

`--scorer` takes a served scorer's name (`SERVED_SCORERS`: `latent_stats`, `latent_reward_model`
of `rewards/latent_scorers.py`, or a plugin's `@register_served_scorer`), `module:factory`
(the factory is called with `--kwargs` as keyword arguments and returns the scorer) or
`reward:NAME` (a registered omni-rl reward built with `--kwargs`). The server binds
127.0.0.1 and refuses any other address unless `--host` is given explicitly.

A token makes every request show `Authorization: Bearer TOKEN`, else 401 and nothing scored. It
comes from the environment variable `OMNI_RL_REWARD_TOKEN` (removed from this process's
environment once read) or from `--token-file PATH`, a token file of mode 0600
(`omni_rl.utils.token_files`; one readable by others is refused, naming its mode); a PATH that
does not exist is written with a fresh token and this server's URL, for the clients to read
(`token_file:` on the reward). `--token` is refused: a command line is every local user's to
read. The first line printed says where the token is, never the token. Without one the server
serves anyone who can reach it, and says so. `--port 0` picks a free port; the first line
printed says the URL. `--header-deadline-s` and `--max-connections` are the transport's
connection bounds (a connection that has not sent its headers in time is closed; one past the
cap is answered 503).
A command line that cannot start a server prints one `error: ...` line and exits 2 for bad
input (an unknown scorer or reward, --kwargs the factory does not take, --port outside 0..65535,
--token, a token file readable by others)
or 1 for a run-time failure (the port is in use, the factory itself failed).

In tests, `serve_in_thread(scorer) -> (server, url)` runs it in a background thread;
`server.stop()` shuts it down and frees the port.

"""
from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import inspect
import json
import logging
import os
import sys
import threading
import urllib.parse
from typing import Any, Callable, Iterator, Sequence

import torch

from omni_rl.registry import Registry
from omni_rl.reward.inputs import RewardInputError
from omni_rl.reward.protocol import (
    CONTENT_TYPE,
    HEALTH_PATH,
    IMAGES,
    KINDS,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    SCORE_PATH,
    TOKEN_ENV,
    ProtocolError,
    check_scores,
    check_version,
    decode_request,
    encode_error,
    encode_response,
)
from omni_rl.reward.scores import RewardScores
from omni_rl.utils import server_args
from omni_rl.utils.http_transport import (
    DEFAULT_HEADER_DEADLINE_S,
    DEFAULT_MAX_CONNECTIONS,
    GuardedHandler,
    GuardedServer,
    HttpRefusal,
    bind_error,
    is_loopback,
    new_token,
)
from omni_rl.utils.token_files import MIN_TOKEN_CHARS, TokenFileError, read_token_file, write_token_file

logger = logging.getLogger(__name__)

ServedScorer = Callable[[torch.Tensor, Sequence[str], Sequence[dict[str, Any]]], Sequence[float]]

# Scorers `--scorer NAME` serves by name: factories `(**kwargs) -> ServedScorer`, registered with
# `@register_served_scorer(name)` by rewards/ (the latent demo scorers) or a plugin.
SERVED_SCORERS: Registry = Registry("served scorer")


def register_served_scorer(name: str):
    return SERVED_SCORERS.register(name)


DEFAULT_HOST = "127.0.0.1"
DEFAULT_MAX_BODY_BYTES = 1 << 30


class HttpStatusError(Exception):
    """Raised by a served scorer to make the server reply `status` with `message`."""

    def __init__(self, status: int, message: str):
        if not 400 <= int(status) <= 599:
            raise ValueError(f"status={status!r}; expected an HTTP error status in 400..599")
        super().__init__(message)
        self.status = int(status)
        self.message = message


class ScoreServer(GuardedServer):
    """Answers POST /score and GET /health with one scorer, on the shared transport
    (`omni_rl.utils.http_transport`: token, body bound, timeouts).

    Use `make_server` or `serve_in_thread`; `url` is the base URL to give a client.
    """

    def __init__(
        self, address: tuple[str, int], scorer: ServedScorer, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        token: str | None = None, header_deadline_s: float = DEFAULT_HEADER_DEADLINE_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ):
        self.scorer = scorer
        self.accepts = getattr(scorer, "accepts", None)
        if self.accepts not in (None, *KINDS):
            raise ValueError(f"scorer.accepts={self.accepts!r}; expected None, 'latents' or 'images'")
        self.scorer_lock = threading.Lock()
        super().__init__(address, _Handler, token=token, max_body_bytes=max_body_bytes,
                         header_deadline_s=header_deadline_s, max_connections=max_connections)

    def error_document(self, message: str) -> bytes:
        return encode_error(message)


def make_server(
    scorer: ServedScorer,
    host: str = DEFAULT_HOST,
    port: int = 0,
    *,
    allow_remote: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    token: str | None = None,
    header_deadline_s: float = DEFAULT_HEADER_DEADLINE_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> ScoreServer:
    """Bind a ScoreServer (not yet serving). A non-loopback `host` needs `allow_remote=True`;
    with a `token`, every request must carry `Authorization: Bearer <token>` (else 401).
    `header_deadline_s` and `max_connections` are the transport's connection bounds."""
    if not callable(scorer):
        raise TypeError(
            f"scorer is a {type(scorer).__name__}; expected a callable (tensor, prompts, metadata) -> scores"
        )
    if not is_loopback(host) and not allow_remote:
        raise ValueError(
            f"host={host!r} is not a loopback address; the reward protocol is plain HTTP, so "
            f"the server binds 127.0.0.1 unless told otherwise. Pass allow_remote=True (or --host on "
            f"the command line) to bind {host!r} on purpose"
        )
    return ScoreServer((host, port), scorer, max_body_bytes=max_body_bytes, token=token,
                       header_deadline_s=header_deadline_s, max_connections=max_connections)


def serve_in_thread(
    scorer: ServedScorer, host: str = DEFAULT_HOST, port: int = 0, **kwargs: Any
) -> tuple[ScoreServer, str]:
    """Start a server in a daemon thread; return (server, base URL). Call `server.stop()` after."""
    server = make_server(scorer, host, port, **kwargs)
    server.thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"reward-server-{server.url}", daemon=True
    )
    server.thread.start()
    return server, server.url


@contextlib.contextmanager
def running_server(scorer: ServedScorer, host: str = DEFAULT_HOST, port: int = 0, **kwargs: Any) -> Iterator[tuple[ScoreServer, str]]:
    """`serve_in_thread` as a context manager: the server stops when the block ends."""
    server, url = serve_in_thread(scorer, host, port, **kwargs)
    try:
        yield server, url
    finally:
        server.stop()


class _Handler(GuardedHandler):
    server: ScoreServer

    def error_body(self, message: str) -> bytes:
        return encode_error(message)

    def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
        if not self.authorized():
            return
        if urllib.parse.urlsplit(self.path).path != HEALTH_PATH:
            return self._error(
                404, f"unknown path {self.path!r}; this server answers GET {HEALTH_PATH} and POST {SCORE_PATH}"
            )
        self._reply(200, json.dumps({
            "status": "ok",
            "protocol": PROTOCOL_VERSION,
            "scorer": _describe(self.server.scorer),
            "accepts": self.server.accepts,
        }).encode())

    def do_POST(self) -> None:  # noqa: N802
        if not self.authorized():
            return
        if urllib.parse.urlsplit(self.path).path != SCORE_PATH:
            return self._error(404, f"unknown path {self.path!r}; POST batches to {SCORE_PATH}")
        try:
            check_version(self.headers.get(PROTOCOL_HEADER))
        except ProtocolError as err:
            return self._error(400, str(err))
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != CONTENT_TYPE:
            return self._error(415, f"Content-Type is {content_type or '(none)'!r}; expected {CONTENT_TYPE!r}")
        try:
            body = self.read_body()
        except HttpRefusal as err:
            return self._error(err.status, err.message)
        try:
            request = decode_request(body)
        except ProtocolError as err:
            return self._error(400, str(err))
        accepts = self.server.accepts
        if accepts is not None and request.kind != accepts:
            return self._error(400, f"this server's scorer takes {accepts!r}; the request sent {request.kind!r}")
        try:
            with self.server.scorer_lock:
                raw = self.server.scorer(request.tensor, request.prompts, request.metadata)
            scores = check_scores(raw, request.batch_size)
        except HttpStatusError as err:
            return self._error(err.status, err.message)
        except RewardInputError as err:  # the batch does not fit the scorer: resending cannot help
            return self._error(400, f"the scorer refused the batch: {err}")
        except ProtocolError as err:
            return self._error(500, str(err))
        except Exception as err:  # the scorer's own failure: report it, keep serving
            logger.exception("reward server: the scorer raised on a batch of %d", request.batch_size)
            return self._error(500, f"the scorer raised {type(err).__name__}: {err}")
        self._reply(200, encode_response(scores))

    def _error(self, status: int, message: str) -> None:
        self._reply(status, encode_error(message))

    def _reply(self, status: int, body: bytes) -> None:
        self.send_body(status, body, "application/json", {PROTOCOL_HEADER: str(PROTOCOL_VERSION)})


class RegisteredReward:
    """Serves a registered omni-rl reward: uint8 images [B, H, W, C] -> its B scores."""

    accepts = IMAGES

    def __init__(self, name: str, scorer: Callable[..., Sequence[float]]):
        self.name = name
        self.scorer = scorer

    def __call__(self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> Sequence[float]:
        out = self.scorer(images, prompts, metadata)
        # The protocol carries scores only: a reward's per-sample groups stay on this side.
        return out.scores if isinstance(out, RewardScores) else out

    def __repr__(self) -> str:
        return f"reward:{self.name}"


def _describe(scorer: Any) -> str:
    name = getattr(scorer, "__qualname__", None)
    return name if isinstance(name, str) else repr(scorer)


# ---------------------------------------------------------------------------------------------
# Command line


class CommandLineError(SystemExit):
    """The command line cannot start a server: `main` prints `error: <message>` (one line) and
    exits with `code`, 2 for bad input (an option, the scorer spec or its --kwargs) and 1 for a
    run-time failure (the port is taken, the scorer's factory failed on its own)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(code)
        self.message = " ".join(message.splitlines())

    def __str__(self) -> str:
        return self.message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage and exits; we raise one line
        raise CommandLineError(f"{message} (see python -m omni_rl.reward.server --help)", 2)


def load_scorer(spec: str, kwargs: dict[str, Any] | None = None) -> ServedScorer:
    """Build the scorer named by a `--scorer` spec (see the module docstring).

    A spec or option that does not fit raises ValueError (or `RewardConfigError`, a
    ValueError, for a `reward:NAME`) naming it; errors raised inside a factory propagate.
    """
    kwargs = dict(kwargs or {})
    from omni_rl.plugins import load_plugins

    load_plugins()  # the served scorers of rewards/ (latent_stats, ...) and of plugins register there
    if spec in SERVED_SCORERS:
        _check_factory_kwargs(spec, SERVED_SCORERS.get(spec), kwargs)
        return SERVED_SCORERS.get(spec)(**kwargs)
    if spec.startswith("reward:"):
        from omni_rl.registry import RegistryError
        from omni_rl.reward.registry import build_reward

        name = spec[len("reward:"):]
        try:
            return RegisteredReward(name, build_reward(name, **kwargs))
        except RegistryError as err:
            raise ValueError(f"--scorer {spec!r}: {err}") from None
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"--scorer {spec!r}: expected a built-in name ({', '.join(SERVED_SCORERS.in_registration_order())}), "
            f"'module:factory' or 'reward:NAME'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"--scorer {spec!r}: module {module_name!r} could not be imported ({err})") from err
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"--scorer {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(factory):
        raise ValueError(f"--scorer {spec!r}: {attr!r} is a {type(factory).__name__}; expected a factory function")
    _check_factory_kwargs(spec, factory, kwargs)
    scorer = factory(**kwargs)
    if not callable(scorer):
        raise ValueError(
            f"--scorer {spec!r}: the factory returned a {type(scorer).__name__}; expected a callable "
            f"(tensor, prompts, metadata) -> list[float]"
        )
    return scorer


def _check_factory_kwargs(spec: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    # Checked before the call, so a TypeError raised inside the factory is not taken for a typo.
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins have no signature
        return
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        accepted = [
            p.name for p in signature.parameters.values()
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        raise ValueError(
            f"--scorer {spec!r} --kwargs {json.dumps(kwargs)}: {err}; accepted options: "
            f"{', '.join(accepted) or '(none)'}"
        ) from None


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; expected a port 0..65535 (0 = a free one)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is out of range; expected a port 0..65535 (0 = a free one)")
    return port




# Raised by a factory handed options it cannot use (a bad value, a missing file): bad input.
_BAD_INPUT_ERRORS = (ValueError, TypeError, LookupError, ImportError, OSError)






# Where a token goes instead of the command line (which every local user reads: ps, /proc/PID/cmdline).
TOKEN_ADVICE = (f"put it in the environment variable {TOKEN_ENV}, or give --token-file PATH (a file of mode "
                f"0600; a PATH that does not exist is written with a fresh token and this server's URL)")


def server_from_args(argv: Sequence[str] | None = None) -> ScoreServer:
    """Parse the command line, build the scorer and bind the server (not yet serving).

    Raises `CommandLineError` (a SystemExit) with a one-line message for anything that stops
    the server from starting; see the class for the exit codes. `server.token_source` says
    where its token is (never the token itself), None without one.
    """
    parser = _Parser(prog="python -m omni_rl.reward.server", description=__doc__.split("\n\n")[0],
                     allow_abbrev=False)  # no prefix of --token-file stands for it
    parser.add_argument(
        "--scorer", required=True, help="latent_stats | latent_reward_model | module:factory | reward:NAME"
    )
    parser.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for the factory")
    parser.add_argument(
        "--host", default=None,
        help=f"address to bind (default {DEFAULT_HOST}; any other address only when given here)",
    )
    parser.add_argument("--port", type=_port, default=0, help="port to bind (0 = a free one, printed at start)")
    parser.add_argument("--max-body-bytes", type=server_args.positive_bytes, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument(
        "--token-file", default=None, metavar="PATH",
        help=f"the token every request must carry as 'Authorization: Bearer TOKEN' (else 401), in a JSON file "
             f"{{\"url\": ..., \"token\": ...}} of mode 0600; a PATH that does not exist is written with a fresh "
             f"token. Default: ${TOKEN_ENV} when set, else no token",
    )
    parser.add_argument("--token", nargs="?", const="", default=None, metavar="(refused)",
                        help=f"refused: a token on the command line is visible to every local user; {TOKEN_ADVICE}")
    parser.add_argument("--header-deadline-s", type=server_args.seconds, default=DEFAULT_HEADER_DEADLINE_S,
                        help="seconds a connection has to send its request headers, then it is closed")
    parser.add_argument("--max-connections", type=server_args.connections, default=DEFAULT_MAX_CONNECTIONS,
                        help="connections served at once that have not shown the token (more are answered 503)")
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
        raise CommandLineError(message, 2) from err
    except Exception as err:  # the factory failed on its own (out of memory, a bug): run time
        raise CommandLineError(f"{where}: building the scorer failed: {type(err).__name__}: {err}", 1) from err
    # Only an explicit --host may bind a non-loopback address: the protocol has no encryption.
    try:
        server = make_server(
            scorer, host, args.port, allow_remote=args.host is not None, max_body_bytes=args.max_body_bytes,
            token=token, header_deadline_s=args.header_deadline_s, max_connections=args.max_connections,
        )
    except OSError as err:
        code = 1 if err.errno == errno.EADDRINUSE else 2  # taken now (run time), or not an address to bind
        raise CommandLineError(bind_error(host, args.port, err), code) from err
    if write_to is not None:  # the URL is known once bound (--port 0)
        try:
            write_token_file(write_to, token, server.url)
        except OSError as err:
            server.server_close()
            raise CommandLineError(f"--token-file {write_to!r}: cannot write it ({err.strerror or err}); give a "
                                   f"path in a folder of your own", 2) from None
    if server is not None:
        server.token_source = token_source
    return server


def _token_from(parser: _Parser, args: argparse.Namespace, host: str) -> tuple[str | None, str | None, str | None]:
    """(token, where it is for the user, the path to write it to) from --token-file or the
    environment; checked before the scorer loads. The variable is removed from this process's
    environment, so that nothing the scorer starts inherits it."""
    from_env = os.environ.pop(TOKEN_ENV, None) or None
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
    try:
        found = read_token_file(path)
    except TokenFileError as err:
        parser.error(f"--token-file: {err}")
    if found.url is not None:
        bound = urllib.parse.urlsplit(found.url)
        if bound.hostname != host or bound.port != args.port:
            parser.error(f"--token-file {path!r} is for {found.url}, and this server would listen on {host}:"
                         f"{args.port or '(a free port)'}; start it with --host/--port of that URL, or delete the "
                         f"file to have a fresh token written for this address")
    return found.token, f"{path} (mode 0600)", None


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = server_from_args(argv)
    except CommandLineError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.code)
    where = f"; token: {server.token_source}" if server.token_source else ""
    print(
        f"omni-rl reward server: {_describe(server.scorer)} at {server.url} (protocol {PROTOCOL_VERSION}){where}",
        flush=True,
    )
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


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy's: served scorers register in (and
    # raise the HttpStatusError of) `omni_rl.reward.server`, which a second copy would not see.
    from omni_rl.reward import server as _server

    sys.exit(_server.main())

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
127.0.0.1 and refuses any other address unless `--host` is given explicitly. `--token SECRET`
(or the environment variable `OMNI_RL_REWARD_TOKEN`) makes every request show
`Authorization: Bearer SECRET`, else 401 and nothing scored; the clients (`http_scorer`,
`latent_http`, `vlm_edit_judge`) send that variable's value when it is set. Without one the
server serves anyone who can reach it, and says so. `--port 0` picks a free port; the first
line printed says the URL.
A command line that cannot start a server prints one `error: ...` line and exits 2 for bad
input (an unknown scorer or reward, --kwargs the factory does not take, --port outside 0..65535)
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
import ipaddress
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
from omni_rl.utils.http_transport import GuardedHandler, GuardedServer, HttpRefusal, bind_error

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


def is_loopback(host: str) -> bool:
    """True for "localhost" and loopback IP literals (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ScoreServer(GuardedServer):
    """Answers POST /score and GET /health with one scorer, on the shared transport
    (`omni_rl.utils.http_transport`: token, body bound, timeouts).

    Use `make_server` or `serve_in_thread`; `url` is the base URL to give a client.
    """

    def __init__(
        self, address: tuple[str, int], scorer: ServedScorer, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        token: str | None = None,
    ):
        self.scorer = scorer
        self.accepts = getattr(scorer, "accepts", None)
        if self.accepts not in (None, *KINDS):
            raise ValueError(f"scorer.accepts={self.accepts!r}; expected None, 'latents' or 'images'")
        self.scorer_lock = threading.Lock()
        super().__init__(address, _Handler, token=token, max_body_bytes=max_body_bytes)


def make_server(
    scorer: ServedScorer,
    host: str = DEFAULT_HOST,
    port: int = 0,
    *,
    allow_remote: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    token: str | None = None,
) -> ScoreServer:
    """Bind a ScoreServer (not yet serving). A non-loopback `host` needs `allow_remote=True`;
    with a `token`, every request must carry `Authorization: Bearer <token>` (else 401)."""
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
    return ScoreServer((host, port), scorer, max_body_bytes=max_body_bytes, token=token)


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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}; expected a whole number of bytes >= 1")
    return value


# Raised by a factory handed options it cannot use (a bad value, a missing file): bad input.
_BAD_INPUT_ERRORS = (ValueError, TypeError, LookupError, ImportError, OSError)


def server_from_args(argv: Sequence[str] | None = None) -> ScoreServer:
    """Parse the command line, build the scorer and bind the server (not yet serving).

    Raises `CommandLineError` (a SystemExit) with a one-line message for anything that stops
    the server from starting; see the class for the exit codes.
    """
    parser = _Parser(prog="python -m omni_rl.reward.server", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scorer", required=True, help="latent_stats | latent_reward_model | module:factory | reward:NAME"
    )
    parser.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for the factory")
    parser.add_argument(
        "--host", default=None,
        help=f"address to bind (default {DEFAULT_HOST}; any other address only when given here)",
    )
    parser.add_argument("--port", type=_port, default=0, help="port to bind (0 = a free one, printed at start)")
    parser.add_argument("--max-body-bytes", type=_positive_int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument(
        "--token", default=None,
        help=f"a secret every request must carry as 'Authorization: Bearer TOKEN' (else 401); default: "
             f"${TOKEN_ENV} when set. Clients send it from the same variable",
    )
    args = parser.parse_args(argv)
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    if token is not None and len(token) < 16:
        parser.error(f"--token is {len(token)} characters; expected a secret of at least 16 (e.g. "
                     f"python -c 'import secrets; print(secrets.token_urlsafe(32))')")
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
    host = DEFAULT_HOST if args.host is None else args.host
    # Only an explicit --host may bind a non-loopback address: the protocol has no encryption.
    try:
        return make_server(
            scorer, host, args.port, allow_remote=args.host is not None, max_body_bytes=args.max_body_bytes,
            token=token,
        )
    except OSError as err:
        code = 1 if err.errno == errno.EADDRINUSE else 2  # taken now (run time), or not an address to bind
        raise CommandLineError(bind_error(host, args.port, err), code) from err


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = server_from_args(argv)
    except CommandLineError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.code)
    print(
        f"omni-rl reward server: {_describe(server.scorer)} at {server.url} (protocol {PROTOCOL_VERSION})",
        flush=True,
    )
    if server.token is None:
        logger.warning("serving without a token: any local process can score with this server "
                       "(give --token or set %s)", TOKEN_ENV)
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

"""`ScoreServer`: the reference server of the remote-scorer protocol (`omni_rl.reward.protocol`).

It serves any `scorer(tensor, prompts, metadata) -> list[float]`; a `OneKindScorer` declares
the one tensor kind it takes. A scorer may raise `HttpStatusError` to choose the status; a
`RewardInputError` is a 400, anything else (or a wrong or non-finite score list) a 500. One
lock runs one batch at a time. The transport is `omni_rl.utils.http_transport`'s; the server
binds 127.0.0.1 unless `allow_remote`. Tests use `serve_in_thread(scorer) -> (server, url)`.

Left out: which scorer a spec names (`omni_rl.reward.server.scorers`) and the command line
(`omni_rl.reward.server.serve`).
"""
from __future__ import annotations

import contextlib
import json
import logging
import threading
import urllib.parse
from typing import Any, Callable, ClassVar, Iterator, Sequence

import torch

from omni_rl.reward.inputs import RewardInputError
from omni_rl.reward.protocol import (
    CONTENT_TYPE,
    HEALTH_PATH,
    KINDS,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    SCORE_PATH,
    ProtocolError,
    check_scores,
    check_version,
    decode_request,
    encode_error,
    encode_response,
)
from omni_rl.utils.http_transport import (
    DEFAULT_HEADER_DEADLINE_S,
    DEFAULT_MAX_CONNECTIONS,
    GuardedHandler,
    GuardedServer,
    HttpRefusal,
    is_loopback,
)

logger = logging.getLogger(__name__)

ServedScorer = Callable[[torch.Tensor, Sequence[str], Sequence[dict[str, Any]]], Sequence[float]]

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


class OneKindScorer:
    """A served scorer that takes one kind of tensor (`accepts`: "latents" or "images"); a
    plain callable takes either."""

    accepts: ClassVar[str] = ""  # a subclass names its kind; the server refuses this empty one

    def __call__(self, tensor: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> Sequence[float]:
        raise NotImplementedError


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
        self.accepts = scorer.accepts if isinstance(scorer, OneKindScorer) else None
        if self.accepts not in (None, *KINDS):
            raise ValueError(f"scorer.accepts={self.accepts!r}; expected None, 'latents' or 'images'")
        self.scorer_lock = threading.Lock()
        super().__init__(address, _Handler, token=token, max_body_bytes=max_body_bytes,
                         header_deadline_s=header_deadline_s, max_connections=max_connections)

    def error_document(self, message: str) -> bytes:
        return encode_error(message)

    def answer_headers(self) -> dict[str, str]:
        return {PROTOCOL_HEADER: str(PROTOCOL_VERSION)}


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

    def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
        if not self.authorized():
            return
        if urllib.parse.urlsplit(self.path).path != HEALTH_PATH:
            return self.send_error_json(
                404, f"unknown path {self.path!r}; this server answers GET {HEALTH_PATH} and POST {SCORE_PATH}"
            )
        self.send_body(200, json.dumps({
            "status": "ok",
            "protocol": PROTOCOL_VERSION,
            "scorer": describe_scorer(self.server.scorer),
            "accepts": self.server.accepts,
        }).encode(), "application/json")

    def do_POST(self) -> None:  # noqa: N802
        if not self.authorized():
            return
        if urllib.parse.urlsplit(self.path).path != SCORE_PATH:
            return self.send_error_json(404, f"unknown path {self.path!r}; POST batches to {SCORE_PATH}")
        try:
            check_version(self.headers.get(PROTOCOL_HEADER))
        except ProtocolError as err:
            return self.send_error_json(400, str(err))
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != CONTENT_TYPE:
            return self.send_error_json(415, f"Content-Type is {content_type or '(none)'!r}; expected {CONTENT_TYPE!r}")
        try:
            body = self.read_body()
        except HttpRefusal as err:
            return self.send_error_json(err.status, err.message)
        try:
            request = decode_request(body)
        except ProtocolError as err:
            return self.send_error_json(400, str(err))
        accepts = self.server.accepts
        if accepts is not None and request.kind != accepts:
            return self.send_error_json(400, f"this server's scorer takes {accepts!r}; the request sent {request.kind!r}")
        try:
            with self.server.scorer_lock:
                raw = self.server.scorer(request.tensor, request.prompts, request.metadata)
            scores = check_scores(raw, request.batch_size)
        except HttpStatusError as err:
            return self.send_error_json(err.status, err.message)
        except RewardInputError as err:  # the batch does not fit the scorer: resending cannot help
            return self.send_error_json(400, f"the scorer refused the batch: {err}")
        except ProtocolError as err:
            return self.send_error_json(500, str(err))
        except Exception as err:  # the scorer's own failure: report it, keep serving
            logger.exception("reward server: the scorer raised on a batch of %d", request.batch_size)
            return self.send_error_json(500, f"the scorer raised {type(err).__name__}: {err}")
        self.send_body(200, encode_response(scores), "application/json")


def describe_scorer(scorer: Any) -> str:
    """The scorer as /health and the start-up line name it."""
    name = getattr(scorer, "__qualname__", None)
    return name if isinstance(name, str) else repr(scorer)

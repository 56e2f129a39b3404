"""The client side of the remote-scorer protocol (`omni_rl.reward.protocol`), with retries.

    client = ScoreClient("http://127.0.0.1:8000", timeout_s=60, retries=3, backoff_s=0.5)
    scores = client.score(latents, prompts, metadata, kind="latents")   # B floats

POSTs to `url + "/score"` and retries connection errors, timeouts, 408, 429 and 5xx with
jittered exponential backoff; any other failure (another status, a malformed or oversized
answer) raises `RewardServerError` at once. A token goes only to the server it was issued for,
and plain http:// leaves loopback only with `allow_insecure_remote`. Statuses, retries, limits
and token rules: `docs/reward_protocol.md`. Left out: connection reuse, name-resolution timeouts.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import random
import time
import urllib.parse
from typing import Any, Callable, Sequence

import torch

from omni_rl.reward.protocol import (
    HEALTH_PATH,
    SCORE_PATH,
    TOKEN_ENV,
    TOKEN_URL_ENV,
    ProtocolError,
    decode_response,
    encode_request,
    error_message,
    metadata_for_wire,
    request_headers,
)
from omni_rl.utils.http_transport import ReplyTooLarge, TransportError, auth_headers, is_loopback, request
from omni_rl.utils.token_files import TokenFileError, read_token_file, same_origin

# Scores of even a large batch are a few kB; an answer past this is not a scorer's.
MAX_REPLY_BYTES = 16 << 20
RETRYABLE_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))


class RewardServerError(RuntimeError):
    """A remote scorer could not produce scores: unreachable, an error status, or a bad reply.

    Attributes: `url` (the endpoint), `status` (the last HTTP status, None for a connection
    error or timeout) and `attempts` (how many requests were made).
    """

    def __init__(self, message: str, *, url: str, status: int | None, attempts: int):
        super().__init__(message)
        self.url = url
        self.status = status
        self.attempts = attempts


class _Transient(Exception):
    """One attempt failed in a way worth retrying; `cause` says how."""

    def __init__(self, cause: str, status: int | None):
        super().__init__(cause)
        self.cause = cause
        self.status = status


class ScoreClient:
    """Talks to one remote scorer; retries and limits: docs/reward_protocol.md.

    url: the server's base URL (http:// or https://). timeout_s: seconds for one whole attempt.
    retries: extra attempts after the first for transient failures. backoff_s / max_backoff_s:
    the first backoff sleep (doubled each retry, jittered) and its cap. sleep, rand: injected for
    tests. token / token_file: this server's secret (default `client_token(url, token_file)`).
    allow_insecure_remote: allow plain http:// outside loopback. max_reply_bytes: the largest answer.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
        token: str | None = None,
        token_file: str | None = None,
        allow_insecure_remote: bool = False,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ):
        parts = check_client_options(
            url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s,
            token_file=token_file, allow_insecure_remote=allow_insecure_remote, max_reply_bytes=max_reply_bytes,
        )
        self._parts = parts
        self._base_path = base = _base_path(parts)
        self.score_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, base + SCORE_PATH, "", ""))
        self.health_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, base + HEALTH_PATH, "", ""))
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self._sleep = sleep
        self._rand = rand
        # The server's token: given, or this server's from a token file or the environment
        # (never from the recipe, which is written to the run's config.yaml).
        self.token = token if token is not None else client_token(url, token_file)
        self.max_reply_bytes = int(max_reply_bytes)

    def __repr__(self) -> str:
        return (
            f"ScoreClient({self.score_url!r}, timeout_s={self.timeout_s:g}, retries={self.retries}, "
            f"backoff_s={self.backoff_s:g})"
        )

    def score(
        self, tensor: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]], *, kind: str
    ) -> list[float]:
        """Encode the batch (`protocol.encode_request`), POST it, return B finite floats."""
        body = encode_request(tensor, prompts, metadata, kind=kind)
        return self.post_score(body, int(tensor.shape[0]))

    def post_score(self, body: bytes, batch_size: int) -> list[float]:
        """POST an already-encoded body to /score with retries; return B finite floats."""
        url = self.score_url
        attempts = 0
        while True:
            attempts += 1
            try:
                status, reply = self._request("POST", self._base_path + SCORE_PATH, body, request_headers(body))
            except _Transient as err:
                last = err
            else:
                if status == 200:
                    try:
                        return decode_response(reply, batch_size)
                    except ProtocolError as err:
                        raise RewardServerError(
                            f"reward server {url} replied 200 with a bad body: {err}",
                            url=url, status=status, attempts=attempts,
                        ) from None
                cause = f"HTTP {status}: {error_message(reply)}"
                if status == 401 and self.token is None:
                    cause += (f"; this client sent no token: give the reward token_file: PATH (the server's "
                              f"--token-file), or set {TOKEN_URL_ENV}={self._origin_url()} with {TOKEN_ENV}")
                if status not in RETRYABLE_STATUSES:
                    raise RewardServerError(
                        f"reward server {url} refused the request ({cause}) after {attempts} "
                        f"attempt(s); HTTP {status} is not retried, fix the request or the URL",
                        url=url, status=status, attempts=attempts,
                    )
                last = _Transient(cause, status)
            if attempts > self.retries:
                raise RewardServerError(
                    f"reward server {url} failed after {attempts} attempt(s): {last.cause}. Check that "
                    f"the server is running and reachable (GET {self.health_url}), or raise "
                    f"timeout_s/retries",
                    url=url, status=last.status, attempts=attempts,
                )
            self._sleep(self.backoff_delay(attempts))

    def backoff_delay(self, retry: int) -> float:
        """Seconds to sleep before retry number `retry` (1-based): equal-jitter exponential."""
        delay = min(self.max_backoff_s, self.backoff_s * 2.0 ** (retry - 1))
        return delay * (0.5 + 0.5 * self._rand())

    def health(self) -> dict[str, Any]:
        """GET /health once (no retries); return its JSON object or raise RewardServerError."""
        url = self.health_url
        try:
            status, reply = self._request("GET", self._base_path + HEALTH_PATH, None, {})
        except _Transient as err:
            raise RewardServerError(
                f"reward server {url} is not reachable: {err.cause}", url=url, status=None, attempts=1
            ) from None
        if status != 200:
            raise RewardServerError(
                f"reward server {url} is not healthy: HTTP {status}: {error_message(reply)}",
                url=url, status=status, attempts=1,
            )
        try:
            payload = json.loads(reply)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            raise RewardServerError(
                f"reward server {url} replied to GET {HEALTH_PATH} with {error_message(reply)}; "
                f"expected a JSON object", url=url, status=status, attempts=1,
            )
        return payload

    def _origin_url(self) -> str:
        return urllib.parse.urlunsplit((self._parts.scheme, self._parts.netloc, "", "", ""))

    def _request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
        """One attempt within `timeout_s` (the shared transport's `request`); returns
        (status, body) or raises _Transient (or RewardServerError, for what no retry can fix)."""
        try:
            status, _, reply = request(self._parts, method, path or "/", body, {**headers, **auth_headers(self.token)},
                                       timeout_s=self.timeout_s, max_reply_bytes=self.max_reply_bytes)
        except ReplyTooLarge as err:  # the same request brings the same answer
            url = urllib.parse.urlunsplit((self._parts.scheme, self._parts.netloc, path, "", ""))
            raise RewardServerError(
                f"reward server {url}: {err.cause} (max_reply_bytes); not retried. A scorer's answer is a few kB: "
                f"check that the url names a reward server, or raise the reward's max_reply_bytes "
                f"(now {err.max_bytes}) if its answers really are this large",
                url=url, status=None, attempts=1,
            ) from None
        except TransportError as err:
            if err.timed_out:
                raise _Transient(f"timed out after {self.timeout_s:g} s (timeout_s: no complete reply within it)",
                                 None) from None
            raise _Transient(err.cause, None) from None
        return status, reply


class RemoteScorer:
    """A reward scored on a remote server, the scorer both `http_scorer` (uint8 images) and
    `latent_http` (float latents) are: `to_wire(samples, prompts, metadata)` checks the batch and
    returns the protocol tensor of `kind`, which is sent with the prompts and the metadata as
    JSON (`protocol.metadata_for_wire`); the answer is the batch's B scores."""

    def __init__(self, name: str, client: ScoreClient, kind: str,
                 to_wire: Callable[[Any, Sequence[str], Sequence[dict[str, Any]]], torch.Tensor]):
        self.name = name
        self.client = client
        self.kind = kind
        self.to_wire = to_wire

    def __call__(self, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        tensor = self.to_wire(samples, prompts, metadata)
        return self.client.score(tensor, list(prompts), metadata_for_wire(metadata), kind=self.kind)

    @property
    def url(self) -> str:
        """The endpoint scored against (named in the reward manager's timeout messages)."""
        return self.client.score_url

    def __repr__(self) -> str:
        return f"RemoteScorer({self.name!r}, {self.client!r})"


SCHEMES = ("http", "https")


def check_client_options(
    url: Any, *, timeout_s: Any = 60.0, retries: Any = 3, backoff_s: Any = 0.5, max_backoff_s: Any = 30.0,
    token_file: Any = None, allow_insecure_remote: Any = False, max_reply_bytes: Any = MAX_REPLY_BYTES,
) -> urllib.parse.SplitResult:
    """Check a `ScoreClient`'s options without building one or connecting; return the split URL.

    Raises ValueError naming the option, the bad value and what is accepted; the remote rewards use
    it as their `check_options`, so a bad URL fails at config load. The token file is read later
    (`check_client_files`, when the run starts).
    """
    if not isinstance(url, str):
        raise ValueError(f"url={url!r}; expected a string such as 'http://127.0.0.1:8000'")
    parts = urllib.parse.urlsplit(url)
    if "://" not in url or parts.scheme not in SCHEMES:
        got = f"the scheme {parts.scheme!r}" if "://" in url else "no scheme"
        raise ValueError(
            f"url={url!r} has {got}; accepted schemes: {', '.join(SCHEMES)} (the server's base URL, "
            f"e.g. 'http://127.0.0.1:8000')"
        )
    if not parts.hostname:
        raise ValueError(f"url={url!r} has no host; expected the server's base URL, e.g. 'http://127.0.0.1:8000'")
    try:
        parts.port  # noqa: B018  (raises ValueError for a bad port)
    except ValueError as err:
        raise ValueError(f"url={url!r} has a bad port ({err}); expected e.g. 'http://127.0.0.1:8000'") from None
    _check_number("timeout_s", timeout_s, minimum=0.0, strict=True)
    if isinstance(retries, bool) or not isinstance(retries, numbers.Integral) or retries < 0:
        raise ValueError(f"retries={retries!r}; expected an int >= 0 (extra attempts after the first)")
    _check_number("backoff_s", backoff_s, minimum=0.0)
    _check_number("max_backoff_s", max_backoff_s, minimum=0.0)
    if not isinstance(allow_insecure_remote, bool):
        raise ValueError(f"allow_insecure_remote={allow_insecure_remote!r}; expected true or false")
    if isinstance(max_reply_bytes, bool) or not isinstance(max_reply_bytes, numbers.Integral) or max_reply_bytes < 1:
        raise ValueError(f"max_reply_bytes={max_reply_bytes!r}; expected a whole number of bytes >= 1")
    if token_file is not None and (not isinstance(token_file, str) or not token_file):
        raise ValueError(f"token_file={token_file!r}; expected the path of the server's token file")
    if parts.scheme == "http" and not is_loopback(parts.hostname) and not allow_insecure_remote:
        raise ValueError(
            f"url={url!r} is plain HTTP to {parts.hostname!r}, a host outside loopback: the batch (and a token) "
            f"would cross the network unencrypted. Use an https:// URL (a TLS proxy in front of the server) or a "
            f"loopback URL through a tunnel, or set allow_insecure_remote: true on this reward to send it anyway"
        )
    if token_file is None:
        _env_token(url)  # a token without the URL it is for is refused here, at load
    return parts


def _base_path(parts: urllib.parse.SplitResult) -> str:
    """The server's path prefix: the url's path without a trailing /score."""
    base = parts.path.rstrip("/")
    return base[: -len(SCORE_PATH)] if base.endswith(SCORE_PATH) else base


def client_endpoint(*, url: str, **_options: Any) -> str:
    """The remote rewards' declared `endpoint`: the score URL of the server their `url` names."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, _base_path(parts) + SCORE_PATH, "", ""))


def check_client_files(*, url: str, token_file: str | None = None, **_options: Any) -> None:
    """Read the reward's token file and check it is for `url` (the remote rewards' `check_files`,
    run when a run starts, before any model loads); raise ValueError naming what is wrong."""
    if token_file is not None:
        client_token(url, token_file)


def client_token(url: str, token_file: str | None = None) -> str | None:
    """The token to send to the server at `url`: the token file's, or the environment's when
    `OMNI_RL_REWARD_TOKEN_URL` names this server; None when this server has none of them.
    A token file of another server, or readable by others, raises ValueError (nothing is sent)."""
    if token_file is None:
        return _env_token(url)
    try:
        found = read_token_file(token_file)
    except TokenFileError as err:
        raise ValueError(f"token_file: {err}") from None
    if found.url is None or not same_origin(found.url, url):
        raise ValueError(
            f"token_file {token_file!r} is for {found.url or '(no url)'}, not for url={url!r}: a token is sent only "
            f"to the server it was issued for. Name that server's token file (its --token-file), or this reward's "
            f"url"
        )
    return found.token


def _env_token(url: str) -> str | None:
    token = os.environ.get(TOKEN_ENV) or None
    if token is None:
        return None
    bound = os.environ.get(TOKEN_URL_ENV) or None
    if bound is None:
        raise ValueError(
            f"{TOKEN_ENV} is set but {TOKEN_URL_ENV} is not: a token is sent only to the server it was issued for. "
            f"Set {TOKEN_URL_ENV} to that server's base URL (e.g. http://127.0.0.1:8000), or give the reward "
            f"token_file: PATH instead"
        )
    return token if same_origin(bound, url) else None


def _check_number(name: str, value: Any, *, minimum: float, strict: bool = False) -> None:
    ok = (
        not isinstance(value, bool)
        and isinstance(value, numbers.Real)
        and math.isfinite(value)
        and (value > minimum if strict else value >= minimum)
    )
    if not ok:
        relation = ">" if strict else ">="
        raise ValueError(f"{name}={value!r}; expected a finite number {relation} {minimum:g} (seconds)")

"""The one HTTP transport under the reward protocol and the rollout protocol.

Both protocols are a few endpoints on a loopback (or explicitly remote) address, spoken between
two omni-rl processes. What they share lives here, once:

Server side (`GuardedServer` + `GuardedHandler`, on the standard library's ThreadingHTTPServer):
- **authentication**: a server given a `token` answers 401, and does nothing else, to any
  request whose `Authorization` header is not `Bearer <token>` (compared in constant time);
- **bounds**: a body needs a Content-Length (411) of at most `max_body_bytes` (413), and is
  read within `body_deadline_s` however the client paces it (408); a connection that sends
  nothing for `timeout` seconds is closed; a request answered before its body was read is
  followed by reading and dropping that body, so the client sees the answer, not a reset;
- JSON answers, one thread per connection, no reverse DNS, routine disconnects logged at debug.
What each protocol serves (paths, messages, locks) stays in its own server module.

Client side (`request`): one attempt of one request within a deadline for the whole exchange
(a watchdog shuts the socket at `timeout_s`: a server that trickles bytes cannot hold it), the
body sent in chunks that stop as soon as an early answer (413) is waiting, and an answer of at
most `max_reply_bytes`. Failures raise `TransportError`; retries and messages are the caller's.

`safe_preview` is how either side quotes bytes it did not expect: escaped and cut, never raw.
`check_json_depth` refuses a JSON document nested deeper than a bound before `json.loads`
recurses into it. Left out: TLS on the server side, keep-alive pools, HTTP/2.
"""
from __future__ import annotations

import contextlib
import errno
import hmac
import http.client
import logging
import re
import secrets
import selectors
import socket
import socketserver
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

logger = logging.getLogger(__name__)

AUTH_HEADER = "Authorization"
MAX_JSON_DEPTH = 64


def new_token() -> str:
    """A fresh per-run secret (256 random bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def auth_headers(token: Optional[str]) -> dict[str, str]:
    """The header that carries `token` (none without one)."""
    return {AUTH_HEADER: f"Bearer {token}"} if token else {}


def token_matches(expected: str, header_value: Optional[str]) -> bool:
    if not header_value or not header_value.startswith("Bearer "):
        return False
    return hmac.compare_digest(header_value[len("Bearer "):].strip().encode(), expected.encode())


def safe_preview(data: bytes | str, limit: int = 200) -> str:
    """`data` quoted for a one-line message: at most `limit` characters, control and non-text
    bytes escaped (a junk answer never writes raw bytes to the terminal)."""
    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray, memoryview)) else str(data)
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def printable(text: str, limit: int = 500) -> str:
    """`text` (a server's own error sentence) with control characters escaped and cut at
    `limit` characters: what a peer sends is shown, never interpreted by the terminal."""
    cut = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return cut + (f"... ({len(text)} characters)" if len(text) > limit else "")


_ESCAPES = re.compile(r"\\.", re.DOTALL)
_STRINGS = re.compile(r'"[^"]*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def check_json_depth(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ValueError when `text` nests arrays/objects deeper than `max_depth` (checked without
    recursion, so `json.loads` never meets a document that would exhaust the stack)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    depth = 0
    # Escapes out first (an escaped quote ends no string), then strings (brackets in them do not
    # nest), then all but the brackets: simple character classes, scanned in C.
    for char in _NOT_BRACKETS.sub("", _STRINGS.sub("", _ESCAPES.sub("", text))):
        depth += 1 if char in "[{" else -1
        if depth > max_depth:
            raise ValueError(f"the JSON nests deeper than {max_depth} levels; expected a flat document")


def bind_error(host: str, port: int, err: OSError, port_option: str = "--port") -> str:
    """One line for a server that cannot listen (the port in use, an address not of this machine)."""
    if err.errno == errno.EADDRINUSE:
        return (f"cannot listen on {host}:{port}: the port is in use; stop what holds it or pick another "
                f"{port_option} (0 = a free one)")
    return (f"cannot listen on {host}:{port}: {err.strerror or err}; give an address of this machine and a "
            f"port you may bind (>= 1024 without privileges)")


class HttpRefusal(Exception):
    """Raised inside a handler to answer `status` with `message` (a JSON error body)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = int(status)
        self.message = message


class GuardedServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with the shared guards (see the module docstring).

    token:          None serves anyone who can reach the address (in-process tests, a server
                    started by hand without one); a string makes every request show it.
    max_body_bytes: the largest request body read (a larger one is a 413).
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type["GuardedHandler"], *, token: Optional[str] = None,
                 max_body_bytes: int = 1 << 30):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        if token is not None and (not isinstance(token, str) or len(token) < 16):
            raise ValueError("token: expected a secret of at least 16 characters (omni_rl.utils.http_transport.new_token())")
        self.token = token
        self.max_body_bytes = int(max_body_bytes)
        self.thread: Optional[threading.Thread] = None
        super().__init__(address, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host up with socket.getfqdn (a reverse DNS query);
        # the name is only used in CGI environments, so skip the lookup.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up (timeout, shutdown) is routine here, not a traceback on stderr.
        logger.debug("%s: error while handling a request from %s", type(self).__name__, client_address, exc_info=True)

    def stop(self) -> None:
        """Stop serving, close the socket and join the serving thread (if one was started)."""
        if self.thread is not None:
            self.shutdown()
            self.thread.join(timeout=10)
            self.thread = None
        self.server_close()


class GuardedHandler(BaseHTTPRequestHandler):
    """The shared request guards; a protocol's handler calls `authorized()` first, reads its
    body with `read_body()` and answers with `send_body()` / `send_error_json()`."""

    server: GuardedServer
    timeout = 120  # seconds a silent connection may hold a handler thread (each read)
    body_deadline_s = 300.0  # the whole body must arrive within this, however it is paced
    # An answer given before the body was read (401, 413, 415, ...) is followed by reading and
    # dropping up to this much of the body, for at most this long (see _discard_unread_body).
    discard_limit_bytes = 64 << 20
    discard_limit_s = 10.0
    _unread = 0

    def error_body(self, message: str) -> bytes:  # the protocol's JSON error document
        raise NotImplementedError

    def authorized(self) -> bool:
        """True when the server has no token or the request shows it; else answers 401."""
        self._unread = _declared_length(self.headers.get("Content-Length")) if self.command == "POST" else 0
        token = self.server.token
        if token is None or token_matches(token, self.headers.get(AUTH_HEADER)):
            return True
        self.send_error_json(401, "missing or wrong Authorization header: this server serves its own run only "
                                  "(send 'Authorization: Bearer <the run's token>')")
        return False

    def read_body(self) -> bytes:
        """The request body, within the server's bounds; raises HttpRefusal (411, 400, 413, 408)."""
        text = self.headers.get("Content-Length")
        if text is None:
            raise HttpRefusal(411, "the request has no Content-Length; send the body's size in bytes")
        try:
            length = int(text)
        except ValueError:
            raise HttpRefusal(400, f"Content-Length is {safe_preview(text, 40)}; expected an integer") from None
        if length < 0 or length > self.server.max_body_bytes:
            raise HttpRefusal(413, f"the body is {length} bytes; this server takes at most "
                                   f"{self.server.max_body_bytes} (send smaller batches)")
        deadline = time.monotonic() + self.body_deadline_s
        chunks, left = [], length
        while left > 0:
            if time.monotonic() > deadline:
                self.close_connection = True
                raise HttpRefusal(408, f"the body did not arrive within {self.body_deadline_s:g} s")
            chunk = self.rfile.read1(min(left, 1 << 20))
            if not chunk:
                self.close_connection = True
                raise HttpRefusal(400, f"the connection closed after {length - left} of {length} body bytes")
            chunks.append(chunk)
            left -= len(chunk)
        self._unread = 0
        return b"".join(chunks)

    def send_error_json(self, status: int, message: str) -> None:
        self.send_body(status, self.error_body(message), "application/json")

    def send_body(self, status: int, body: bytes, content_type: str, headers: Optional[dict[str, str]] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
        if self._unread > 0:
            self._discard_unread_body()

    def _discard_unread_body(self) -> None:
        """After answering a request whose body was not read, read and drop that body.

        Closing a socket with unread data in it makes the kernel send a reset, which destroys
        the answer before the client reads it: the client, still sending, sees a broken pipe
        and retries as if the server were down. So the server half-closes (the answer is
        followed by end-of-stream) and reads on until the client has sent the body, hangs up,
        or `discard_limit_bytes` / `discard_limit_s` run out.
        """
        self.close_connection = True
        left = min(self._unread, self.discard_limit_bytes)
        self._unread = 0
        deadline = time.monotonic() + self.discard_limit_s
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)
            while left > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.connection.settimeout(remaining)
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (http.server's name)
        logger.debug("%s %s: " + format, type(self.server).__name__, self.address_string(), *args)


def _declared_length(text: Optional[str]) -> int:
    """The Content-Length as an int >= 0, or 0 when missing or malformed (then none is read)."""
    try:
        return max(0, int(text)) if text is not None else 0
    except ValueError:
        return 0


# --- the client side ---------------------------------------------------------------------------
class TransportError(Exception):
    """One request failed before a whole answer came back. `timed_out` tells a deadline from a
    connection error; `cause` is the one-line reason."""

    def __init__(self, cause: str, *, timed_out: bool):
        super().__init__(cause)
        self.cause = cause
        self.timed_out = timed_out


_SEND_CHUNK = 1 << 20


def request(parts: urllib.parse.SplitResult, method: str, path: str, body: Optional[bytes], headers: dict[str, str],
            *, timeout_s: float, max_reply_bytes: int) -> tuple[int, http.client.HTTPResponse, bytes]:
    """One attempt within `timeout_s` for the whole exchange; returns (status, response, body)
    or raises TransportError (a reply larger than `max_reply_bytes` is one too)."""
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout_s)
    expired = threading.Event()

    def cut_off() -> None:
        # A socket timeout bounds one recv/send, so a server that trickles bytes would never
        # trip it; shutting the socket down wakes whichever call is blocked on it.
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, also under TLS

    watchdog = threading.Timer(timeout_s, cut_off)
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.connect()
        if expired.is_set():  # the deadline passed while connecting, before conn.sock was set
            raise TimeoutError
        try:
            _send_request(conn, method, path or "/", body, headers)
        except (BrokenPipeError, ConnectionResetError):
            # The server answered early and closed while the body was on its way: its answer
            # may still be waiting to be read. If it is not, the send error stands.
            if expired.is_set():
                raise
            try:
                response = conn.getresponse()
                return response.status, response, _read_capped(response, max_reply_bytes)
            except (OSError, http.client.HTTPException):
                pass
            raise
        response = conn.getresponse()
        reply = _read_capped(response, max_reply_bytes)
        if expired.is_set():  # read() may return a cut-off body as if the server had closed
            raise TimeoutError
        return response.status, response, reply
    except TransportError:
        raise
    except Exception as err:
        if expired.is_set() or isinstance(err, TimeoutError):  # socket.timeout is TimeoutError
            raise TransportError(f"timed out after {timeout_s:g} s (no complete reply within it)",
                                 timed_out=True) from None
        if isinstance(err, (OSError, http.client.HTTPException)):
            raise TransportError(f"connection error: {type(err).__name__}: {err}", timed_out=False) from None
        raise
    finally:
        watchdog.cancel()
        conn.close()


def _read_capped(response: http.client.HTTPResponse, max_reply_bytes: int) -> bytes:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > max_reply_bytes:
        raise TransportError(f"the answer is {int(declared)} bytes; this client reads at most {max_reply_bytes}",
                             timed_out=False)
    data = response.read(max_reply_bytes + 1)
    if len(data) > max_reply_bytes:
        raise TransportError(f"the answer is larger than {max_reply_bytes} bytes; this client reads at most that",
                             timed_out=False)
    return data


def _send_request(conn: http.client.HTTPConnection, method: str, path: str, body: Optional[bytes],
                  headers: dict[str, str]) -> None:
    """`conn.request`, but the body goes in 1 MiB chunks and stops early once the server has
    answered: a server that refuses a body (413) answers after reading the headers, and
    sending the rest of a large body would only end in a broken pipe."""
    conn.putrequest(method, path)
    if body is not None and "content-length" not in {key.lower() for key in headers}:
        conn.putheader("Content-Length", str(len(body)))
    for key, value in headers.items():
        conn.putheader(key, value)
    conn.endheaders()
    view = memoryview(body or b"")
    with selectors.DefaultSelector() as waiting:  # not select.select: it fails for fds >= 1024
        waiting.register(conn.sock, selectors.EVENT_READ)
        for start in range(0, len(view), _SEND_CHUNK):
            if start and waiting.select(timeout=0):  # an answer (or a hang-up) is waiting
                return
            conn.send(view[start : start + _SEND_CHUNK])

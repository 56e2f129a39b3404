"""The one HTTP transport under the reward protocol and the rollout protocol.

Server side (`GuardedServer`, `GuardedHandler`): bearer tokens, bounded bodies and deadlines, a
cap on unauthenticated connections. Client side (`request`): one attempt within one deadline, a
bounded reply, failures as `TransportError`. Left out: server TLS, keep-alive pools, HTTP/2.
"""
from __future__ import annotations

import contextlib
import errno
import hmac
import http.client
import ipaddress
import json
import math
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
DEFAULT_HEADER_DEADLINE_S = 10.0
DEFAULT_MAX_CONNECTIONS = 64
_DIGITS = re.compile(r"[0-9]+")


def is_loopback(host: str) -> bool:
    """True for "localhost" and loopback IP literals (127.0.0.0/8, ::1); no name is resolved."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    header_deadline_s: seconds a connection has to send a request's headers (each request's,
                    counted from when the server starts waiting for it); then it is closed.
    max_connections: connections served at once that have not shown the token (every one, on a
                    server without a token); one more is answered 503 and closed.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type["GuardedHandler"], *, token: Optional[str] = None,
                 max_body_bytes: int = 1 << 30, header_deadline_s: float = DEFAULT_HEADER_DEADLINE_S,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        if token is not None and (not isinstance(token, str) or len(token) < 16):
            raise ValueError("token: expected a secret of at least 16 characters (omni_rl.utils.http_transport.new_token())")
        check_server_limits(header_deadline_s, max_connections)
        self.token = token
        self.max_body_bytes = int(max_body_bytes)
        self.header_deadline_s = float(header_deadline_s)
        self.max_connections = int(max_connections)
        self.thread: Optional[threading.Thread] = None
        # Connections that count against max_connections, and those waiting for their headers
        # (socket -> deadline), under one condition the reaper thread waits on.
        self._watch = threading.Condition()
        self._counted: set[socket.socket] = set()
        self._header_deadlines: dict[socket.socket, float] = {}
        self._reaper: Optional[threading.Thread] = None
        self._closing = False
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

    def error_document(self, message: str) -> bytes:
        """The JSON error body of this protocol (a subclass adds its fields)."""
        return json.dumps({"error": message}).encode()

    def answer_headers(self) -> dict[str, str]:
        """Headers every answer carries (a protocol's version header)."""
        return {}

    # --- connection bounds -------------------------------------------------------------------
    def process_request(self, request: Any, client_address: Any) -> None:
        with self._watch:
            full = len(self._counted) >= self.max_connections
            if not full:
                self._counted.add(request)
                self._start_reaper()
        if full:  # answered here, in the serving thread: a refused connection costs no thread
            self._refuse_busy(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def connections_counted(self) -> int:
        """How many connections count against `max_connections` now."""
        with self._watch:
            return len(self._counted)

    def waiting_for_headers(self, connection: socket.socket) -> None:
        with self._watch:
            self._header_deadlines[connection] = time.monotonic() + self.header_deadline_s
            self._watch.notify()

    def headers_received(self, connection: socket.socket) -> None:
        with self._watch:
            self._header_deadlines.pop(connection, None)

    def token_shown(self, connection: socket.socket) -> None:
        """The connection showed the token: the run's own client, no longer counted."""
        with self._watch:
            self._counted.discard(connection)

    def _forget(self, connection: socket.socket) -> None:
        with self._watch:
            self._counted.discard(connection)
            self._header_deadlines.pop(connection, None)

    def _refuse_busy(self, request: socket.socket) -> None:
        message = (f"this server is serving its limit of {self.max_connections} connections that have not shown "
                   f"its token; try again later")
        body = self.error_document(message)
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n").encode()
        with contextlib.suppress(OSError):
            request.setblocking(False)  # a peer that reads nothing cannot block the serving thread
            request.send(head + body)
        self.shutdown_request(request)

    def _start_reaper(self) -> None:  # called with self._watch held
        if self._reaper is None and not self._closing:
            self._reaper = threading.Thread(target=self._reap, name=f"{type(self).__name__}-header-deadline",
                                            daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        """Shut down every connection past its header deadline; its handler then sees
        end-of-stream and ends, freeing the thread."""
        with self._watch:
            while not self._closing:
                now = time.monotonic()
                for connection, deadline in list(self._header_deadlines.items()):
                    if deadline <= now:
                        del self._header_deadlines[connection]
                        with contextlib.suppress(OSError):
                            connection.shutdown(socket.SHUT_RDWR)
                soonest = min(self._header_deadlines.values(), default=now + 60.0)
                self._watch.wait(timeout=max(0.01, soonest - now))

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up (timeout, shutdown) is routine here, not a traceback on stderr.
        logger.debug("%s: error while handling a request from %s", type(self).__name__, client_address, exc_info=True)

    def server_close(self) -> None:
        with self._watch:
            self._closing = True
            self._watch.notify()
            reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.join(timeout=10)
        super().server_close()

    def stop(self) -> None:
        """Stop serving, close the socket and join the serving thread (if one was started)."""
        if self.thread is not None:
            self.shutdown()
            self.thread.join(timeout=10)
            self.thread = None
        self.server_close()


def check_server_limits(header_deadline_s: Any, max_connections: Any) -> None:
    """Raise ValueError naming a header deadline or connection cap a server cannot use."""
    if isinstance(header_deadline_s, bool) or not isinstance(header_deadline_s, (int, float)) \
            or not math.isfinite(header_deadline_s) or header_deadline_s <= 0:
        raise ValueError(f"header_deadline_s={header_deadline_s!r}; expected a finite number of seconds > 0")
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
        raise ValueError(f"max_connections={max_connections!r}; expected a whole number >= 1")


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

    def handle_one_request(self) -> None:
        # Each request's headers are due within the server's header deadline (parse_request
        # below says when they are in); the reaper closes a connection that misses it.
        self.server.waiting_for_headers(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server.headers_received(self.connection)

    def parse_request(self) -> bool:
        try:
            return super().parse_request()  # reads the headers
        finally:
            self.server.headers_received(self.connection)

    def authorized(self) -> bool:
        """True when the server has no token or the request shows it; else answers 401."""
        self._unread = _declared_length(self.headers.get("Content-Length")) if self.command == "POST" else 0
        token = self.server.token
        if token is None:
            return True
        if token_matches(token, self.headers.get(AUTH_HEADER)):
            self.server.token_shown(self.connection)
            return True
        self.send_error_json(401, "missing or wrong Authorization header: this server serves its own run only "
                                  "(send 'Authorization: Bearer <the run's token>')")
        return False

    def read_body(self) -> bytes:
        """The request body, within the server's bounds; raises HttpRefusal (411, 400, 413, 408)."""
        text = self.headers.get("Content-Length")
        if text is None:
            raise HttpRefusal(411, "the request has no Content-Length; send the body's size in bytes")
        if not _DIGITS.fullmatch(text.strip()):  # int() also takes "-5", "+5", "1_0" and other scripts' digits
            raise HttpRefusal(400, f"Content-Length is {safe_preview(text, 40)}; expected the body's size in bytes, "
                                   f"a whole number >= 0")
        length = int(text)
        if length > self.server.max_body_bytes:
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
        self.send_body(status, self.server.error_document(message), "application/json")

    def send_body(self, status: int, body: bytes, content_type: str, headers: Optional[dict[str, str]] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in {**self.server.answer_headers(), **(headers or {})}.items():
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
    return int(text) if text is not None and _DIGITS.fullmatch(text.strip()) else 0


# --- the client side ---------------------------------------------------------------------------
class TransportError(Exception):
    """One request failed before a whole answer came back. `timed_out` tells a deadline from a
    connection error; `cause` is the one-line reason."""

    def __init__(self, cause: str, *, timed_out: bool):
        super().__init__(cause)
        self.cause = cause
        self.timed_out = timed_out


class ReplyTooLarge(TransportError):
    """The answer is larger than the client reads (`max_bytes`): resending cannot change that."""

    def __init__(self, cause: str, max_bytes: int):
        super().__init__(cause, timed_out=False)
        self.max_bytes = max_bytes


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
        raise ReplyTooLarge(f"the answer is {int(declared)} bytes; this client reads at most {max_reply_bytes}",
                            max_reply_bytes)
    data = response.read(max_reply_bytes + 1)
    if len(data) > max_reply_bytes:
        raise ReplyTooLarge(f"the answer is larger than {max_reply_bytes} bytes; this client reads at most that",
                            max_reply_bytes)
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

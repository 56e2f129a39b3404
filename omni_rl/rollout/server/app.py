"""`RolloutServer`: a rollout engine served over loopback HTTP (rollout protocol, version 1).

    GET  /health           {"status": "ok", "protocol", "pid", "weight_version", "engine"}
    GET  /stats            {"protocol", "pid", "weight_version", "weight_kind", "stats": {...}}
    POST /generate         message {"requests": [...], "timeout_s": t} -> message {"results": [...]}
    POST /update_weights   one bucket of named tensors (metadata version, kind, bucket, last)
    POST /sleep, /wake     the engine's sleep() / wake()
    POST /shutdown         answers, then stops serving

Every request and answer carries `X-Omni-RL-Rollout-Protocol`; a request without it or with
another version is a 400 naming both versions. Errors are JSON `{"error": ..., "protocol": 1}`:
400 a malformed or refused request, 404 an unknown path, 500 the engine raised. Calls into the
engine are serialised (one lock): the native text engine samples in its caller's thread, and a
weight bucket must never land in the middle of a generate call. GET /health and /stats take no
lock: they answer while a generate runs, which is how the client tells a busy server from a
silent one.

Left out on purpose: authentication (it binds loopback only), retries (a generate is not
resent: the client fails the step and names the server), streaming of partial results.
"""
from __future__ import annotations

import json
import logging
import os
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from omni_rl.rollout.base import RolloutEngine, check_weight_kind
from omni_rl.rollout.server.protocol import (
    CONTENT_TYPE,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    ProtocolError,
    decode_message,
    decode_weights,
    encode_message,
    version_mismatch,
)

logger = logging.getLogger(__name__)


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class RolloutServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, engine: RolloutEngine, host: str = "127.0.0.1", port: int = 0):
        self.engine = engine
        self.protocol_version = PROTOCOL_VERSION  # a test may change it to see the mismatch refused
        self.engine_lock = threading.Lock()
        self.weight_kind: str | None = None
        self.counters = {"generate_calls": 0, "weight_updates": 0, "weight_buckets": 0, "weight_tensors": 0, "asleep": False}
        super().__init__((host, port), _Handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # no reverse DNS lookup of the host
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("rollout server: error while handling a request from %s", client_address, exc_info=True)

    def stats(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol_version, "pid": os.getpid(), "weight_version": self.engine.weight_version,
            "weight_kind": self.weight_kind, "stats": {**dict(self.engine.stats), **self.counters},
        }

    # --- the endpoints (each called under engine_lock) -----------------------------------
    def generate(self, body: bytes) -> bytes:
        message = decode_message(body)
        requests, timeout_s = message["requests"], float(message["timeout_s"])
        self.counters["generate_calls"] += 1
        return encode_message({"results": self.engine.generate(requests, timeout_s=timeout_s)})

    def update_weights(self, body: bytes) -> dict[str, Any]:
        tensors, version, kind, bucket, last = decode_weights(body)
        try:
            check_weight_kind(kind)
        except ValueError as err:
            raise HttpError(400, str(err)) from None
        # Buckets before the last keep the old version: the new one is recorded once all are in.
        self.engine.update_weights(tensors, version if last else self.engine.weight_version, kind)
        self.counters["weight_buckets"] += 1
        self.counters["weight_tensors"] += len(tensors)
        if last:
            self.counters["weight_updates"] += 1
            self.weight_kind = kind
        return {"weight_version": self.engine.weight_version, "loaded": len(tensors)}


class _Handler(BaseHTTPRequestHandler):
    server: RolloutServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
        self._answer({"/health": self._health, "/stats": self.server.stats})

    def do_POST(self) -> None:  # noqa: N802
        self._answer({
            "/generate": self.server.generate, "/update_weights": self.server.update_weights,
            "/sleep": self._sleep, "/wake": self._wake, "/shutdown": self._shutdown,
        })

    def _health(self) -> dict[str, Any]:
        return {"status": "ok", "protocol": self.server.protocol_version, "pid": os.getpid(),
                "weight_version": self.server.engine.weight_version, "engine": type(self.server.engine).__name__}

    def _sleep(self, body: bytes) -> dict[str, Any]:
        self.server.engine.sleep()
        self.server.counters["asleep"] = True
        return {"asleep": True}

    def _wake(self, body: bytes) -> dict[str, Any]:
        self.server.engine.wake()
        self.server.counters["asleep"] = False
        return {"asleep": False}

    def _shutdown(self, body: bytes) -> dict[str, Any]:
        threading.Thread(target=self.server.shutdown, daemon=True).start()
        return {"stopping": True}

    def _answer(self, routes: dict) -> None:
        path = self.path.split("?")[0]
        body = b""
        try:
            if self.command == "POST":
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            mismatch = version_mismatch(self.headers.get(PROTOCOL_HEADER), self.server.protocol_version, "this rollout server")
            if mismatch:
                raise HttpError(400, mismatch)
            if path not in routes:
                raise HttpError(404, f"unknown path {self.command} {path}: expected one of {sorted(routes)}")
            call = routes[path]
            if self.command == "GET":
                out = call()
            else:
                with self.server.engine_lock:
                    out = call(body)
        except HttpError as err:
            return self._reply(err.status, {"error": str(err)})
        except (ProtocolError, ValueError, KeyError, TypeError) as err:
            return self._reply(400, {"error": f"refused {path}: {err}"})
        except Exception as err:  # noqa: BLE001 (the engine's failure goes back to the client)
            logger.exception("rollout server: %s failed", path)
            return self._reply(500, {"error": f"{path} failed in the rollout server: {err!r}"})
        self._reply(200, out)

    def _reply(self, status: int, out: Any) -> None:
        if isinstance(out, bytes):
            body, content_type = out, CONTENT_TYPE
        else:
            body, content_type = json.dumps({**out, "protocol": self.server.protocol_version}).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header(PROTOCOL_HEADER, str(self.server.protocol_version))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (http.server's name)
        logger.debug("rollout server: " + format, *args)

"""`RolloutServer`: a rollout engine served over loopback HTTP (rollout protocol, version 1).

Endpoints `/health`, `/stats`, `/generate`, `/update_weights`, `/sleep`, `/wake` and
`/shutdown`, their messages and error statuses: docs/rollout_protocol.md. The transport (token,
body and connection bounds) is `omni_rl.utils.http_transport`'s. Each generate request is
checked with the engine's `check_request` before any reaches the engine. Engine calls hold one
lock (a weight bucket must never land mid-generate); /health and /stats take none, so they
answer while a generate runs.

Left out on purpose: retries (the client fails the step and names the server), streaming.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Optional

from omni_rl.rollout.base import RolloutEngine, check_weight_kind
from omni_rl.rollout.server.protocol import (
    CONTENT_TYPE,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    ProtocolError,
    decode_message,
    decode_weights,
    encode_message,
)
from omni_rl.utils.http_transport import (
    DEFAULT_HEADER_DEADLINE_S,
    DEFAULT_MAX_CONNECTIONS,
    GuardedHandler,
    GuardedServer,
    HttpRefusal,
)
from omni_rl.utils.wire import error_document, version_mismatch

logger = logging.getLogger(__name__)

# A weight bucket holds at least one whole tensor (an LLM's embedding can pass 1 GiB) and a
# generate call a chunk of requests with their condition images: the bound is for accidents,
# the token keeps everyone else out before a byte of the body is read.
DEFAULT_MAX_BODY_BYTES = 16 << 30


class RolloutServer(GuardedServer):
    def __init__(self, engine: RolloutEngine, host: str = "127.0.0.1", port: int = 0, *,
                 token: Optional[str] = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 header_deadline_s: float = DEFAULT_HEADER_DEADLINE_S, max_connections: int = DEFAULT_MAX_CONNECTIONS):
        self.engine = engine
        self.protocol_version = PROTOCOL_VERSION  # a test may change it to see the mismatch refused
        self.engine_lock = threading.Lock()
        self.weight_kind: str | None = None
        self.counters = {"generate_calls": 0, "weight_updates": 0, "weight_buckets": 0, "weight_tensors": 0,
                         "asleep": False, "refused_requests": 0}
        super().__init__((host, port), _Handler, token=token, max_body_bytes=max_body_bytes,
                         header_deadline_s=header_deadline_s, max_connections=max_connections)

    def error_document(self, message: str) -> bytes:
        return error_document(message, self.protocol_version)

    def answer_headers(self) -> dict[str, str]:
        return {PROTOCOL_HEADER: str(self.protocol_version)}

    def stats(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol_version, "pid": os.getpid(), "weight_version": self.engine.weight_version,
            "weight_kind": self.weight_kind, "stats": {**dict(self.engine.stats), **self.counters},
        }

    # --- the endpoints ---------------------------------------------------------------------
    def check_generate(self, body: bytes) -> tuple[list, float]:
        """The decoded requests and deadline, each request checked by the engine (no lock: a
        check reads the model's configuration only); a bad one is a 400 naming it."""
        message = decode_message(body)
        if not isinstance(message, dict) or not isinstance(message.get("requests"), list):
            raise HttpRefusal(400, "a generate message is {'requests': [...], 'timeout_s': t}")
        requests, timeout_s = message["requests"], float(message.get("timeout_s", 1800.0))
        if not 0 < timeout_s < float("inf"):
            raise HttpRefusal(400, f"timeout_s={timeout_s!r}: expected a finite number of seconds > 0")
        for req in requests:
            try:
                self.engine.check_request(req)
            except (ValueError, TypeError, KeyError) as err:
                self.counters["refused_requests"] += 1
                raise HttpRefusal(400, f"refused request {getattr(req, 'request_id', '?')}: {err}") from None
        return requests, timeout_s

    def generate(self, requests: list, timeout_s: float) -> bytes:
        self.counters["generate_calls"] += 1
        return encode_message({"results": self.engine.generate(requests, timeout_s=timeout_s)})

    def update_weights(self, body: bytes) -> dict[str, Any]:
        tensors, version, kind, bucket, last = decode_weights(body)
        try:
            check_weight_kind(kind)
        except ValueError as err:
            raise HttpRefusal(400, str(err)) from None
        # Buckets before the last keep the old version: the new one is recorded once all are in.
        self.engine.update_weights(tensors, version if last else self.engine.weight_version, kind)
        self.counters["weight_buckets"] += 1
        self.counters["weight_tensors"] += len(tensors)
        if last:
            self.counters["weight_updates"] += 1
            self.weight_kind = kind
        return {"weight_version": self.engine.weight_version, "loaded": len(tensors)}


class _Handler(GuardedHandler):
    server: RolloutServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
        self._answer({"/health": self._health, "/stats": self.server.stats})

    def do_POST(self) -> None:  # noqa: N802
        self._answer({
            "/generate": self._generate, "/update_weights": self.server.update_weights,
            "/sleep": self._sleep, "/wake": self._wake, "/shutdown": self._shutdown,
        })

    def _health(self) -> dict[str, Any]:
        problem = self.server.engine.failure()
        if problem is not None:
            raise HttpRefusal(503, f"the rollout engine cannot sample any more: {problem}")
        return {"status": "ok", "protocol": self.server.protocol_version, "pid": os.getpid(),
                "weight_version": self.server.engine.weight_version, "engine": type(self.server.engine).__name__}

    def _generate(self, body: bytes) -> bytes:
        requests, timeout_s = self.server.check_generate(body)
        with self.server.engine_lock:
            return self.server.generate(requests, timeout_s)

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
        if not self.authorized():
            return
        path = self.path.split("?")[0]
        try:
            mismatch = version_mismatch(self.headers.get(PROTOCOL_HEADER), self.server.protocol_version, PROTOCOL_HEADER,
                                        "this rollout server", "the client")
            if mismatch:
                raise HttpRefusal(400, mismatch)
            if path not in routes:
                raise HttpRefusal(404, f"unknown path {self.command} {path}: expected one of {sorted(routes)}")
            call = routes[path]
            if self.command == "GET":
                out = call()
            else:
                body = self.read_body()
                if path == "/generate":
                    out = call(body)  # checks the requests, then takes the engine lock itself
                else:
                    with self.server.engine_lock:
                        out = call(body)
        except HttpRefusal as err:
            return self.send_error_json(err.status, err.message)
        except (ProtocolError, ValueError, KeyError, TypeError) as err:
            return self.send_error_json(400, f"refused {path}: {err}")
        except Exception as err:  # noqa: BLE001 (the engine's failure goes back to the client)
            logger.exception("rollout server: %s failed", path)
            return self.send_error_json(500, f"{path} failed in the rollout server: {err!r}")
        self._reply(200, out)

    def _reply(self, status: int, out: Any) -> None:
        if isinstance(out, bytes):
            body, content_type = out, CONTENT_TYPE
        else:
            body, content_type = json.dumps({**out, "protocol": self.server.protocol_version}).encode(), "application/json"
        self.send_body(status, body, content_type)

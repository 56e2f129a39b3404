"""`RolloutServer`: a rollout engine served over loopback HTTP (rollout protocol, version 1).

Endpoints `/health`, `/stats`, `/generate`, `/turns/start`, `/turns/next`, `/turns/close` (a
multi-turn generate, `turns.py`; served where the engine's backend declares `multi_turn`),
`/update_weights`, `/sleep`, `/wake` and `/shutdown`, their messages and error statuses:
docs/rollout_protocol.md. The transport (token,
body and connection bounds) is `omni_rl.utils.http_transport`'s. Each generate request is
checked with the engine's `check_request` before any reaches the engine. Engine calls hold one
lock (a weight bucket must never land mid-generate; a multi-turn session's engine thread holds it
for the whole session); /health, /stats and a session's /turns/next and /turns/close take none,
so they answer while a generate runs.

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
from omni_rl.rollout.server.turns import TurnSession
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
                 token: Optional[str] = None, multi_turn: bool = False, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 header_deadline_s: float = DEFAULT_HEADER_DEADLINE_S, max_connections: int = DEFAULT_MAX_CONNECTIONS):
        self.engine = engine
        # Whether the engine samples multi-turn trajectories (its backend's declared `multi_turn`).
        self.multi_turn = multi_turn
        self.sessions: dict[str, TurnSession] = {}
        self.sessions_lock = threading.Lock()
        self.protocol_version = PROTOCOL_VERSION  # a test may change it to see the mismatch refused
        self.engine_lock = threading.Lock()
        self.weight_kind: str | None = None
        self.counters = {"generate_calls": 0, "weight_updates": 0, "weight_buckets": 0, "weight_tensors": 0,
                         "asleep": False, "refused_requests": 0, "turn_sessions": 0, "turns_served": 0}
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
        return self.check_requests(message["requests"]), _timeout(message)

    def check_requests(self, requests: list) -> list:
        for req in requests:
            try:
                self.engine.check_request(req)
            except (ValueError, TypeError, KeyError) as err:
                self.counters["refused_requests"] += 1
                raise HttpRefusal(400, f"refused request {getattr(req, 'request_id', '?')}: {err}") from None
        return requests

    def generate(self, requests: list, timeout_s: float) -> bytes:
        self.counters["generate_calls"] += 1
        return encode_message({"results": self.engine.generate(requests, timeout_s=timeout_s)})

    def start_turns(self, body: bytes) -> dict[str, Any]:
        """Start a multi-turn session (`turns.TurnSession`); its engine thread takes the engine lock."""
        if not self.multi_turn:
            raise HttpRefusal(400, f"this rollout server's engine ({type(self.engine).__name__}) does not sample "
                                   f"multi-turn trajectories (its backend declares multi_turn=False)")
        message = decode_message(body)
        if not isinstance(message, dict) or not isinstance(message.get("requests"), list) \
                or not isinstance(message.get("max_total_tokens"), int):
            raise HttpRefusal(400, "a /turns/start message is {'requests': [...], 'max_total_tokens': n, 'timeout_s': t}")
        requests, timeout_s = self.check_requests(message["requests"]), _timeout(message)
        session = TurnSession(self.engine, requests, message["max_total_tokens"], timeout_s, self.engine_lock)
        with self.sessions_lock:
            self.sessions[session.id] = session
        self.counters["turn_sessions"] += 1
        return {"session": session.id}

    def _session(self, message: Any, path: str) -> TurnSession:
        name = message.get("session") if isinstance(message, dict) else None
        with self.sessions_lock:
            session = self.sessions.get(name)
        if session is None:
            raise HttpRefusal(404, f"{path}: no multi-turn session {name!r} (it ended, was closed or never started)")
        return session

    def next_turns(self, body: bytes) -> bytes:
        message = decode_message(body)
        session = self._session(message, "/turns/next")
        wait_s = float(message.get("wait_s", 0.0))
        if not 0 <= wait_s <= 60:
            raise HttpRefusal(400, f"wait_s={wait_s!r}: expected seconds in [0, 60]")
        session.answer(message.get("answers") or [])
        try:
            reply = session.next(wait_s)
        except BaseException:
            self._drop_session(session)
            raise
        self.counters["turns_served"] += len(reply["ended"])
        if reply["results"] is not None:
            self._drop_session(session)
        return encode_message(reply)

    def close_turns(self, body: bytes) -> dict[str, Any]:
        session = self._session(decode_message(body), "/turns/close")
        session.close()
        self._drop_session(session)
        return {"closed": session.id}

    def _drop_session(self, session: TurnSession) -> None:
        with self.sessions_lock:
            self.sessions.pop(session.id, None)

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


def _timeout(message: dict) -> float:
    timeout_s = float(message.get("timeout_s", 1800.0))
    if not 0 < timeout_s < float("inf"):
        raise HttpRefusal(400, f"timeout_s={timeout_s!r}: expected a finite number of seconds > 0")
    return timeout_s


# Paths whose calls take the engine lock themselves (a check first, or a session's thread) or
# need none (a session's calls, while its thread holds it).
_OWN_LOCKING = frozenset({"/generate", "/turns/start", "/turns/next", "/turns/close"})


class _Handler(GuardedHandler):
    server: RolloutServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
        self._answer({"/health": self._health, "/stats": self.server.stats})

    def do_POST(self) -> None:  # noqa: N802
        self._answer({
            "/generate": self._generate, "/update_weights": self.server.update_weights,
            "/turns/start": self.server.start_turns, "/turns/next": self.server.next_turns,
            "/turns/close": self.server.close_turns,
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
                if path in _OWN_LOCKING:
                    out = call(body)  # checks the requests, then takes the engine lock itself (or needs none)
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

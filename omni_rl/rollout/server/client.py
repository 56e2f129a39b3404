"""`ServerRolloutEngine` (`rollout.backend=server`): the rollout contract over HTTP to a rollout server.

`start_server_engine` starts `python -m omni_rl.rollout.server` with the run's secret token,
waits for its address and a health check, and sends the trainable tensors as version 0.
Requests go in chunks of `rollout.max_num_seqs`, one POST /generate each (at most
`MAX_GENERATE_CALLS` open); a multi-turn generate (`generate_turns`) is a session of calls whose
tool loop runs here (`turns.py`); a server that exits or stops answering fails the call with a
`RolloutEngineError` naming its address, pid and the call. The server samples with its own
model copy, so the trainer recomputes old log-probs. Details: docs/rollout_protocol.md.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Optional, Sequence

import omni_rl
from omni_rl.config.loader import to_yaml
from omni_rl.config.schema import OmniConfig
from omni_rl.rollout.base import RolloutEngine, RolloutEngineError, check_weight_kind, weight_kind
from omni_rl.rollout.server.protocol import (
    CONTENT_TYPE,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    TOKEN_ENV,
    decode_message,
    encode_message,
    encode_weights,
)
from omni_rl.rollout.server.turns import drive_turns
from omni_rl.utils.http_transport import TransportError, auth_headers, new_token, request
from omni_rl.utils.wire import error_text, version_mismatch
from omni_rl.utils.tensor_buckets import NamedTensors, named_buckets


# Results of one chunk of requests: latents and images of up to max_num_seqs samples.
MAX_REPLY_BYTES = 64 << 30
# POST /generate calls open at once. The server runs one at a time (its engine lock), so more
# would only wait there, and each counts against the server's max_connections until its
# headers are in: a large step must not crowd itself out with 503s.
MAX_GENERATE_CALLS = 8


class ServerRolloutEngine(RolloutEngine):
    """Client of one rollout server at `url`; owns `process` when it started it. `token` is the
    server's secret (sent as `Authorization: Bearer <token>` with every call)."""

    def __init__(self, url: str, *, timeout_s: float = 60.0, rollout_timeout_s: float = 1800.0, chunk_size: int = 32,
                 bucket_bytes: int = 512 << 20, process: Optional[subprocess.Popen] = None, pid: Optional[int] = None,
                 token: Optional[str] = None):
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size}: expected >= 1 requests per call")
        parts = urllib.parse.urlsplit(url)
        self.url, self.host, self.port, self._parts = url, parts.hostname, parts.port, parts
        self.token = token
        self.timeout_s = timeout_s
        self.rollout_timeout_s = rollout_timeout_s
        self.chunk_size = chunk_size
        self.bucket_bytes = bucket_bytes
        self.process = process
        self.protocol_version = PROTOCOL_VERSION  # a test may change it to see the mismatch refused
        self.weight_version = 0
        self.pid = pid if pid is not None else (process.pid if process is not None else None)
        self._closed = False
        self._generate_slots = threading.BoundedSemaphore(MAX_GENERATE_CALLS)
        if self.pid is None:
            self.pid = self._json("GET", "/health", what="checking its health")["pid"]

    # --- the contract --------------------------------------------------------------------
    def submit_many(self, requests: Sequence[Any]) -> list[Future]:
        self._check_open()
        futures: list[Future] = [Future() for _ in requests]
        for a in range(0, len(requests), self.chunk_size):
            chunk, futs = list(requests[a : a + self.chunk_size]), futures[a : a + self.chunk_size]
            threading.Thread(target=self._generate_chunk, args=(chunk, futs), daemon=True,
                             name="omni-rl-rollout-client").start()
        return futures

    def wait(self, requests: Sequence[Any], futures: Sequence[Future], timeout_s: float) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        interval = min(5.0, self.timeout_s / 4)
        next_check = time.monotonic() + interval
        for req, fut in zip(requests, futures):
            while not fut.done():
                now = time.monotonic()
                if now >= deadline:
                    raise RolloutEngineError(
                        f"rollout timed out after {timeout_s:.0f} s waiting for request {req.request_id} from "
                        f"{self._where()}; raise rollout.timeout_s if the model is just slow"
                    )
                try:
                    fut.result(timeout=min(0.5, deadline - now))
                except Exception:  # noqa: BLE001 (done or not, looked at below)
                    pass
                if not fut.done() and time.monotonic() >= next_check:
                    self._json("GET", "/health", what=f"checking its health while generating {len(requests)} requests",
                               timeout_s=max(1.0, self.timeout_s - interval))
                    next_check = time.monotonic() + interval
            err = fut.exception()
            if isinstance(err, RolloutEngineError):
                raise err
            if err is not None:
                raise RolloutEngineError(f"rollout failed for request {req.request_id} in {self._where()}: {err!r}") from err
        return [f.result() for f in futures]

    def generate_turns(self, requests: Sequence[Any], handler, max_total_tokens: int) -> list[Any]:
        """Multi-turn trajectories sampled by the server's engine, each ended turn answered here
        by `handler` (the agent loop, in this process): one session of calls (`turns.py`)."""
        self._check_open()
        if not requests:
            return []

        def call(path: str, message: dict[str, Any]) -> Any:
            wait_s = float(message.get("wait_s", 0.0))
            body = self._call("POST", path, encode_message(message), CONTENT_TYPE,
                              what=f"{path[1:]} of a multi-turn generate of {len(requests)} trajectories",
                              timeout_s=self.timeout_s + wait_s)
            return decode_message(body) if path == "/turns/next" else json.loads(body)

        return drive_turns(requests, handler, call, max_total_tokens, self.rollout_timeout_s, self._where)

    def update_weights(self, tensors: NamedTensors, version: int, kind: str) -> None:
        """Bucket by bucket as `tensors` yields them (one bucket ahead, to mark the last)."""
        check_weight_kind(kind)
        buckets = named_buckets(tensors, self.bucket_bytes)
        bucket, i = next(buckets, {}), 0
        while True:
            following = next(buckets, None)
            self._call("POST", "/update_weights", encode_weights(bucket, version, kind, i, following is None),
                       CONTENT_TYPE, what=f"updating weights to version {version} ({kind}, bucket {i + 1})")
            if following is None:
                break
            bucket, i = following, i + 1
        self.weight_version = version

    def sleep(self) -> None:
        self._json("POST", "/sleep", what="putting it to sleep")

    def wake(self) -> None:
        self._json("POST", "/wake", what="waking it")

    @property
    def stats(self) -> dict[str, Any]:
        """The server's view: its weight_version and weight_kind, and its engine's counters."""
        answer = self._json("GET", "/stats", what="reading its stats")
        return {"weight_version": answer["weight_version"], "weight_kind": answer["weight_kind"], **answer["stats"]}

    def same_log_probs_as(self, model) -> bool:
        return False  # another process and copy of the model: the trainer recomputes

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                self._json("POST", "/shutdown", what="shutting it down", timeout_s=min(10.0, self.timeout_s))
                self.process.wait(timeout=min(30.0, self.timeout_s))
            except (RolloutEngineError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(timeout=30)

    # --- HTTP ----------------------------------------------------------------------------
    def _where(self) -> str:
        return f"the rollout server at {self.url} (pid {self.pid})"

    def _check_open(self) -> None:
        if self._closed:
            raise RolloutEngineError(f"{self._where()}: this client is closed")
        if self.process is not None and self.process.poll() is not None:
            raise RolloutEngineError(f"{self._where()} has exited with code {self.process.returncode} "
                                     f"(its messages are above, on stderr)")

    def _generate_chunk(self, chunk: list, futures: list[Future]) -> None:
        what = f"generating {len(chunk)} requests (ids {chunk[0].request_id}..{chunk[-1].request_id})"
        try:
            # The chunk's own deadline is the rollout's (the server applies it to its engine too);
            # a server that stops answering meanwhile is caught by wait's health checks.
            with self._generate_slots:
                body = self._call("POST", "/generate",
                                  encode_message({"requests": chunk, "timeout_s": self.rollout_timeout_s}),
                                  CONTENT_TYPE, what=what, timeout_s=self.rollout_timeout_s + self.timeout_s)
            results = decode_message(body)["results"]
            if len(results) != len(chunk):
                raise RolloutEngineError(f"{self._where()} answered {len(results)} results for {len(chunk)} requests")
            for fut, res in zip(futures, results):
                fut.set_result(res)
        except BaseException as err:  # noqa: BLE001 (every failure must reach the waiting caller)
            for fut in futures:
                if not fut.done():
                    fut.set_exception(err)

    def _json(self, method: str, path: str, *, what: str, timeout_s: Optional[float] = None) -> dict[str, Any]:
        return json.loads(self._call(method, path, b"" if method == "POST" else None, "application/json",
                                     what=what, timeout_s=timeout_s))

    def _call(self, method: str, path: str, body: Optional[bytes], content_type: str, *, what: str,
              timeout_s: Optional[float] = None) -> bytes:
        """One request; any failure is a RolloutEngineError naming the server and `what`."""
        if self.process is not None and self.process.poll() is not None:
            raise RolloutEngineError(f"{self._where()} has exited with code {self.process.returncode} while "
                                     f"{what} (its messages are above, on stderr)")
        headers = {PROTOCOL_HEADER: str(self.protocol_version), **auth_headers(self.token)}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            status, response, data = request(self._parts, method, path, body, headers,
                                             timeout_s=timeout_s or self.timeout_s, max_reply_bytes=MAX_REPLY_BYTES)
        except TransportError as err:
            exited = self.process is not None and self.process.poll() is not None
            cause = f"it exited with code {self.process.returncode}" if exited else err.cause
            raise RolloutEngineError(f"{self._where()} failed while {what}: {cause}") from None
        sent = response.getheader(PROTOCOL_HEADER)
        if status != 200:
            raise RolloutEngineError(f"{self._where()} refused {method} {path} while {what}: "
                                     f"HTTP {status}: {error_text(data)}")
        mismatch = version_mismatch(sent, self.protocol_version, PROTOCOL_HEADER, "this rollout client",
                                    "the rollout server")
        if mismatch:
            raise RolloutEngineError(f"{self._where()} answered {method} {path}: {mismatch}")
        return data


def start_server_engine(cfg: OmniConfig, model, options, backend: str = "native") -> ServerRolloutEngine:
    """Start the server process for this run, serving the in-process rollout backend `backend`,
    and connect to it (see the module docstring). `options` are the run's backend's
    (`rollout.backend_options`: `python`, `server_timeout_s`, `server_startup_timeout_s`)."""
    r = cfg.rollout
    python = options.python or sys.executable
    config_dir = tempfile.mkdtemp(prefix="omni-rl-rollout-server-")
    config_path = Path(config_dir) / "config.yaml"
    config_path.write_text(to_yaml(cfg))
    env = dict(os.environ)
    root = str(Path(omni_rl.__file__).resolve().parent.parent)  # this checkout's omni_rl (and adapters/)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    # The run's secret: handed over in the environment (which only this user can read), never
    # on the command line (which every local user can, with ps).
    token = new_token()
    env[TOKEN_ENV] = token
    command = [python, "-m", "omni_rl.rollout.server", "--config", str(config_path), "--backend", backend,
               "--parent-pid", str(os.getpid())]
    try:
        try:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, env=env, text=True)
        except OSError as err:
            raise RolloutEngineError(f"rollout.backend_options.python={python!r}: cannot start the rollout server ({err})") from None
        ready = _read_ready_line(process, options.server_startup_timeout_s, command)
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)  # read by the server before it reports ready
    engine = ServerRolloutEngine(
        ready["url"], timeout_s=options.server_timeout_s, chunk_size=r.max_num_seqs,
        bucket_bytes=cfg.trainer.weight_sync_bucket_mb << 20, process=process, pid=ready["pid"], token=token,
    )
    try:
        engine._json("GET", "/health", what="checking its health after it started")
        if not model.weightless:  # a weightless view (as `_start_from_trainer`): the server keeps the checkpoint's
            engine.update_weights(model.named_trainable_tensors(), 0, weight_kind(model))
    except BaseException:
        engine.close()
        raise
    return engine


def _read_ready_line(process: subprocess.Popen, timeout_s: float, command: list[str]) -> dict[str, Any]:
    """The server's first stdout line (its address), within `timeout_s`; then stdout is drained."""
    lines: list[str] = []
    got, eof = threading.Event(), threading.Event()

    def read() -> None:
        for line in process.stdout:
            if not got.is_set():
                lines.append(line)
                if line.lstrip().startswith("{"):
                    got.set()
        eof.set()
        got.set()

    threading.Thread(target=read, daemon=True, name="omni-rl-rollout-server-stdout").start()
    got.wait(timeout_s)
    for line in lines:
        if line.lstrip().startswith("{"):
            try:
                ready = json.loads(line)
                return {"url": ready["url"], "pid": int(ready["pid"])}
            except (ValueError, KeyError):
                break
    if eof.is_set():  # its stdout closed: it is exiting, or has
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    code = process.poll()
    if code is None:
        process.kill()
        process.wait(timeout=30)
        why = f"did not report its address within rollout.backend_options.server_startup_timeout_s={timeout_s:g} s"
    else:
        why = f"exited with code {code} before it was ready"
    raise RolloutEngineError(
        f"the rollout server (pid {process.pid}, `{' '.join(command)}`) {why}; its messages are above, on stderr"
    )

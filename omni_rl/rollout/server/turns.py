"""Multi-turn generation across the rollout protocol: the server's session and the client's loop.

The engine's `generate_turns` asks a `TurnHandler` what follows each model turn, and the agent
loop that answers (tool calls, environments) stays in the trainer's process. So a multi-turn
generate is a session of several calls:

1. `POST /turns/start` `{"requests", "max_total_tokens", "timeout_s"}` starts the engine's
   `generate_turns` in a thread of the server (under its engine lock), with a `TurnSession`
   as its handler; the answer names the session;
2. `POST /turns/next` `{"session", "answers", "wait_s"}` hands over the answers to turns that
   ended (`{"request_id", "ids"}`: the tokens to feed, or null: that trajectory ends) and
   returns the turns that ended since (`{"request_id", "turn_ids", "finish_reason", "room"}`,
   waiting up to `wait_s` for one), and, once every trajectory is done, the results;
3. `POST /turns/close` `{"session"}` ends a session early (the client failed); so does its
   deadline, `timeout_s` after the start.

The engine keeps sampling the other trajectories while the trainer answers one: batching stays
request-level. Not here: HTTP (app.py, client.py), what a turn means (`omni_rl.agent`).
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Callable, Optional, Sequence

from omni_rl.rollout.base import RolloutEngineError

_session_ids = itertools.count(1)
# How long the client lets its tools run before it asks the server again (and the server waits
# for a turn to end when the client has nothing to hand over).
POLL_S = 0.02
IDLE_WAIT_S = 1.0


class TurnSession:
    """One multi-turn generate in the server: `engine.generate_turns` in a thread of its own,
    each ended turn queued for the client and waiting on a future the client's answer completes."""

    def __init__(self, engine, requests: Sequence[Any], max_total_tokens: int, timeout_s: float,
                 lock: threading.Lock):
        self.id = f"turns-{next(_session_ids)}"
        self.ended: "queue.Queue[dict[str, Any]]" = queue.Queue()
        self.pending: dict[int, Future] = {}
        self.mutex = threading.Lock()
        self.results: Optional[list] = None
        self.error: Optional[BaseException] = None
        self.finished = threading.Event()
        self.closed: Optional[str] = None  # why, once closed
        self._timer = threading.Timer(timeout_s, self.close, args=(f"it ran past its timeout_s={timeout_s:g} s",))
        self._timer.daemon = True
        self._thread = threading.Thread(target=self._run, args=(engine, list(requests), max_total_tokens, lock),
                                        name=f"omni-rl-{self.id}", daemon=True)
        self._thread.start()
        self._timer.start()

    def _run(self, engine, requests: list, max_total_tokens: int, lock: threading.Lock) -> None:
        try:
            with lock:
                self.results = engine.generate_turns(requests, self, max_total_tokens)
        except BaseException as err:  # noqa: BLE001 (goes back to the client with its next call)
            self.error = err
        finally:
            self._timer.cancel()
            self.finished.set()
            self.ended.put({})  # wakes a `next` that waits

    # --- the engine's side (TurnHandler) ----------------------------------------------------
    def end_turn(self, request_id: int, turn_ids: list[int], finish_reason: str, room: int) -> Future:
        future: Future = Future()
        with self.mutex:
            if self.closed is not None:  # nobody will answer: the engine stops at this turn
                future.set_exception(RolloutEngineError(f"session {self.id} was closed: {self.closed}"))
                return future
            if request_id in self.pending:
                raise RuntimeError(f"request {request_id} ended a turn while its last one waits for its answer")
            self.pending[request_id] = future
        self.ended.put({"request_id": int(request_id), "turn_ids": [int(t) for t in turn_ids],
                        "finish_reason": finish_reason, "room": int(room)})
        return future

    # --- the client's side ----------------------------------------------------------------------
    def answer(self, answers: Sequence[dict[str, Any]]) -> None:
        """Complete the futures of the answered turns; ValueError naming an unknown one."""
        for item in answers:
            rid, ids = int(item["request_id"]), item["ids"]
            with self.mutex:
                future = self.pending.pop(rid, None)
            if future is None:
                raise ValueError(f"session {self.id}: an answer for request {rid}, which has no turn waiting")
            if ids is not None and not (isinstance(ids, list) and all(isinstance(t, int) for t in ids)):
                raise ValueError(f"session {self.id}: the answer of request {rid} must be a list of token ids or "
                                 f"null, got {type(ids).__name__}")
            future.set_result(ids)

    def next(self, wait_s: float) -> dict[str, Any]:
        """The turns ended since the last call (waiting up to `wait_s` for one) and, once the
        engine is done, its results. The engine's failure is raised here."""
        ended = []
        try:
            # The engine puts a last (empty) item after it has finished: a wait never outlasts it.
            waits = wait_s > 0 and not self.finished.is_set()
            first = self.ended.get(timeout=wait_s) if waits else self.ended.get_nowait()
            if first:
                ended.append(first)
        except queue.Empty:
            pass
        while True:
            try:
                item = self.ended.get_nowait()
            except queue.Empty:
                break
            if item:
                ended.append(item)
        if self.finished.is_set() and self.error is not None:
            raise RolloutEngineError(f"session {self.id}: the engine's generate_turns failed: {self.error!r}") \
                from self.error
        done = self.finished.is_set() and not ended
        return {"ended": ended, "results": self.results if done else None}

    def close(self, why: str = "the client closed it") -> None:
        """End the session: every turn still waiting for its answer fails, so the engine's
        `generate_turns` raises and lets go of the engine."""
        with self.mutex:
            self.closed = why
            pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(RolloutEngineError(f"session {self.id} was closed: {why}"))


def drive_turns(requests: Sequence[Any], handler, call: Callable[[str, dict[str, Any]], Any],
                max_total_tokens: int, timeout_s: float, where: Callable[[], str]) -> list:
    """The client's side of a multi-turn generate: start a session with `call(path, message)`,
    hand each ended turn to `handler` (the trainer's agent loop), send its answers back, until the
    results come. On any failure the session is closed (best effort) before the error is raised."""
    session = call("/turns/start", {"requests": list(requests), "max_total_tokens": int(max_total_tokens),
                                    "timeout_s": float(timeout_s)})["session"]
    deadline = time.monotonic() + timeout_s
    pending: dict[int, Future] = {}
    answers: list[dict[str, Any]] = []
    try:
        while True:
            reply = call("/turns/next", {"session": session, "answers": answers,
                                         "wait_s": POLL_S if pending else IDLE_WAIT_S})
            answers = []
            for turn in reply["ended"]:
                pending[turn["request_id"]] = handler.end_turn(turn["request_id"], turn["turn_ids"],
                                                               turn["finish_reason"], turn["room"])
            if reply["results"] is not None:
                if len(reply["results"]) != len(requests):
                    raise RolloutEngineError(f"{where()} answered {len(reply['results'])} trajectories for "
                                             f"{len(requests)} requests")
                return reply["results"]
            if time.monotonic() > deadline:
                raise RolloutEngineError(f"{where()}: the multi-turn generate of {len(requests)} trajectories ran "
                                         f"past {timeout_s:g} s; raise rollout.timeout_s if the model is just slow")
            if pending:
                wait(list(pending.values()), timeout=POLL_S, return_when=FIRST_COMPLETED)
            for rid in [rid for rid, future in pending.items() if future.done()]:
                ids = pending.pop(rid).result()
                answers.append({"request_id": rid, "ids": None if ids is None else [int(t) for t in ids]})
    except BaseException:
        try:
            call("/turns/close", {"session": session})
        except Exception:  # noqa: BLE001 (the first failure is the one to report)
            pass
        raise

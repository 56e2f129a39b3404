"""The shared transport's resource bounds on both servers (issue 45, L6, N11, N17, item 7): idle
connections cost at most `max_connections` threads and are closed after the header deadline,
one past the cap is answered 503 without a thread, a connection that showed the token stops
counting, and a negative or non-numeric Content-Length is a 400. All on loopback, bounded."""
from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.parse

import pytest
import torch

from omni_rl.reward.protocol import CONTENT_TYPE as REWARD_CONTENT_TYPE
from omni_rl.reward.protocol import PROTOCOL_HEADER as REWARD_PROTOCOL_HEADER
from omni_rl.reward.protocol import encode_request
from omni_rl.reward.server import make_server
from omni_rl.rollout.base import RolloutEngine
from omni_rl.rollout.server.app import RolloutServer
from omni_rl.rollout.server.protocol import CONTENT_TYPE as ROLLOUT_CONTENT_TYPE
from omni_rl.rollout.server.protocol import PROTOCOL_HEADER as ROLLOUT_PROTOCOL_HEADER
from omni_rl.rollout.server.protocol import encode_message
from omni_rl.utils.http_transport import new_token, request
from rewards.latent_scorers import latent_stats

TOKEN = new_token()
IDLE = 50
CAP = 8


class _Echo(RolloutEngine):
    def submit_many(self, requests):
        raise NotImplementedError

    def wait(self, requests, futures, timeout_s):
        raise NotImplementedError

    def generate(self, requests, timeout_s=1800.0):
        return list(requests)

    def update_weights(self, tensors, version, kind):
        self.weight_version = version


def _reward_server(**kwargs):
    return make_server(latent_stats(), token=TOKEN, **kwargs)


def _rollout_server(**kwargs):
    return RolloutServer(_Echo(), token=TOKEN, **kwargs)


# (build the server, a POST path that reads a body, the headers that get a request that far)
SERVERS = {
    "reward": (_reward_server, "/score", {REWARD_PROTOCOL_HEADER: "1", "Content-Type": REWARD_CONTENT_TYPE}),
    "rollout": (_rollout_server, "/update_weights", {ROLLOUT_PROTOCOL_HEADER: "1", "Content-Type": ROLLOUT_CONTENT_TYPE}),
}


def _start(kind, **kwargs):
    server = SERVERS[kind][0](**kwargs)
    server.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    server.thread.start()
    return server


def _read_until_closed(sock: socket.socket, timeout: float = 60.0) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except ConnectionResetError:
        return data


def _wait_for(condition, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_idle_connections_hold_at_most_the_cap_in_threads_and_are_closed_after_the_header_deadline(kind):
    server = _start(kind, header_deadline_s=2.0, max_connections=CAP)
    baseline = threading.active_count()  # this test's threads and the serving thread
    most, sampling = [0], threading.Event()

    def sample():
        while not sampling.is_set():
            most[0] = max(most[0], threading.active_count() - baseline - 1)  # less this sampler
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    host, port = server.server_address[:2]
    idle = []
    try:
        for _ in range(IDLE):  # connect and send nothing
            idle.append(socket.create_connection((host, port), timeout=30))
        answers = [_read_until_closed(sock) for sock in idle]  # every one ends without a byte from us
        assert _wait_for(lambda: server.connections_counted() == 0)
    finally:
        sampling.set()
        sampler.join(timeout=30)
        for sock in idle:
            sock.close()
        server.stop()
    busy = [a for a in answers if a.startswith(b"HTTP/1.1 503 ")]
    assert all(a == b"" for a in answers if a not in busy), {a[:40] for a in answers}
    assert busy, "the connections past the cap were served instead of refused"
    body = json.loads(busy[0].split(b"\r\n\r\n", 1)[1])
    assert f"its limit of {CAP} connections that have not shown its token" in body["error"]
    # The handlers of the admitted connections, plus the reaper that closes them; not one each.
    assert most[0] <= CAP + 1, most[0]


class _Blocking:
    """A scorer and an engine whose call waits for `release`, saying `entered` when it starts."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def wait_for_release(self):
        self.entered.set()
        assert self.release.wait(timeout=60)


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_a_connection_that_showed_the_token_stops_counting(kind):
    block = _Blocking()
    if kind == "reward":
        def scorer(latents, prompts, metadata):
            block.wait_for_release()
            return [0.0] * len(prompts)

        server = make_server(scorer, token=TOKEN, max_connections=1)
        body, path = encode_request(torch.zeros(1, 4), ["p"], [{}], kind="latents"), "/score"
    else:
        class _Slow(_Echo):
            def generate(self, requests, timeout_s=1800.0):
                block.wait_for_release()
                return list(requests)

        server = RolloutServer(_Slow(), token=TOKEN, max_connections=1)
        body, path = encode_message({"requests": [], "timeout_s": 30.0}), "/generate"
    server.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    server.thread.start()
    headers = SERVERS[kind][2]
    answers = []
    owner = threading.Thread(target=lambda: answers.append(request(
        urllib.parse.urlsplit(server.url), "POST", path, body, {**headers, "Authorization": f"Bearer {TOKEN}"},
        timeout_s=60, max_reply_bytes=1 << 20)[0]), daemon=True)
    owner.start()
    host, port = server.server_address[:2]
    try:
        assert block.entered.wait(timeout=60)  # the run's own long call is under way, its token shown
        assert server.connections_counted() == 0
        # The one slot is free for someone else: a stranger is answered (401), not refused 503.
        with socket.create_connection((host, port), timeout=30) as stranger:
            stranger.sendall(f"GET /health HTTP/1.1\r\nHost: x\r\n{ROLLOUT_PROTOCOL_HEADER}: 1\r\n"
                             f"Connection: close\r\n\r\n".encode())
            assert re.match(rb"HTTP/1\.[01] 401 ", _read_until_closed(stranger))
        block.release.set()
        owner.join(timeout=60)
    finally:
        block.release.set()
        server.stop()
    assert answers == [200]


@pytest.mark.parametrize("kind", sorted(SERVERS))
@pytest.mark.parametrize("length", ["-5", "+5", "abc", "1_0", "0x10"])
def test_a_negative_or_non_numeric_content_length_is_400(kind, length):
    server = _start(kind)
    _, path, headers = SERVERS[kind]
    host, port = server.server_address[:2]
    try:
        with socket.create_connection((host, port), timeout=30) as sock:
            head = "".join(f"{k}: {v}\r\n" for k, v in {**headers, "Authorization": f"Bearer {TOKEN}"}.items())
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {length}\r\n"
                         f"Connection: close\r\n\r\n".encode("latin-1"))
            answer = _read_until_closed(sock)
    finally:
        server.stop()
    assert re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:200]
    message = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert message.startswith("Content-Length is ") and "expected the body's size in bytes, a whole number >= 0" in message


def test_bad_limits_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"header_deadline_s=0; expected a finite number of seconds > 0"):
        _reward_server(header_deadline_s=0)
    with pytest.raises(ValueError, match=r"header_deadline_s=inf"):
        _rollout_server(header_deadline_s=float("inf"))
    with pytest.raises(ValueError, match=r"max_connections=0; expected a whole number >= 1"):
        _reward_server(max_connections=0)


def test_the_rollout_client_keeps_its_generate_calls_few():
    # A step of many chunks must not crowd its own server's cap out with 503s.
    from omni_rl.rollout.server import client as client_module

    assert client_module.MAX_GENERATE_CALLS < 64  # the servers' default max_connections
    server = _start("rollout", max_connections=client_module.MAX_GENERATE_CALLS + 2)
    try:
        engine = client_module.ServerRolloutEngine(server.url, timeout_s=30, chunk_size=1, token=TOKEN, pid=0)
        requests = [{"i": i} for i in range(40)]

        class _Req(dict):
            request_id = 0

        reqs = [_Req(r) for r in requests]
        futures = engine.submit_many(reqs)
        results = engine.wait(reqs, futures, timeout_s=120)
    finally:
        server.stop()
    assert [dict(r) for r in results] == requests

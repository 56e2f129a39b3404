"""The rollout server serves its own run only, and no single request takes it down (issue 29,
items 4 to 6): a request without the run's token gets 401 and changes nothing; a bad request
is refused with 400 to its sender and the next good one is served; /health tells a dead engine;
bodies are bounded, malformed or deeply nested messages are 400, a trickling client is cut off,
and a command line that cannot start says so in one line."""
from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
import urllib.parse

import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.config.loader import to_yaml
from omni_rl.rollout.base import RolloutEngine, RolloutEngineError
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.server import serve
from omni_rl.rollout.server.app import RolloutServer, _Handler
from omni_rl.rollout.server.client import ServerRolloutEngine, start_server_engine
from omni_rl.rollout.server.protocol import CONTENT_TYPE, PROTOCOL_HEADER, encode_message, encode_weights
from omni_rl.rollout.types import DiffusionRequest
from omni_rl.utils.http_transport import auth_headers, new_token

TOKEN = new_token()


class _EchoEngine(RolloutEngine):
    """Answers a request with itself; no model (the transport tests need none)."""

    def submit_many(self, requests):
        raise NotImplementedError

    def wait(self, requests, futures, timeout_s):
        raise NotImplementedError

    def generate(self, requests, timeout_s=1800.0):
        return list(requests)

    def update_weights(self, tensors, version, kind):
        self.weight_version = version


def _serve(engine, **kwargs) -> RolloutServer:
    server = RolloutServer(engine, token=TOKEN, **kwargs)
    server.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    server.thread.start()
    return server


@pytest.fixture
def echo():
    server = _serve(_EchoEngine())
    yield server
    server.stop()


def _raw(url, method, path, body=None, headers=None, timeout=30):
    """One request as any local process could send it: no client of ours, no token unless given."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={PROTOCOL_HEADER: "1", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _req(**overrides):
    fields = dict(prompt="a cat", seed=1, height=32, width=32, num_steps=2, guidance_scale=4.5,
                  sde_window_range=(0, 2))
    return DiffusionRequest(**{**fields, **overrides})


# --- authentication ---------------------------------------------------------------------------
def test_a_request_without_the_runs_token_gets_401_and_changes_nothing(echo):
    owner = ServerRolloutEngine(echo.url, timeout_s=10, token=TOKEN)
    owner.update_weights({"w": torch.ones(2)}, 3, "lora")
    before = owner.stats
    weights = encode_weights({"w": torch.zeros(2)}, 99, "full", 0, True)
    generate = encode_message({"requests": [_req()], "timeout_s": 10})
    for headers in ({}, auth_headers("wrong-" + TOKEN), {"Authorization": TOKEN}):
        for method, path, body in (("POST", "/shutdown", b""), ("POST", "/update_weights", weights),
                                   ("POST", "/generate", generate), ("POST", "/sleep", b""),
                                   ("GET", "/health", None), ("GET", "/stats", None)):
            status, reply = _raw(echo.url, method, path, body, {"Content-Type": CONTENT_TYPE, **headers})
            assert status == 401, (method, path, status, reply)
            assert "Authorization" in json.loads(reply)["error"] and b"weight_version" not in reply
    # The run is unaffected: still serving, same weights, nothing counted.
    assert owner.stats == before and before["weight_version"] == 3 and before["weight_kind"] == "lora"
    (back,) = owner.generate([_req()], timeout_s=10)
    assert back.prompt == "a cat"
    tokenless = ServerRolloutEngine(echo.url, timeout_s=10, pid=0)
    with pytest.raises(RolloutEngineError, match="HTTP 401"):
        tokenless.update_weights({"w": torch.zeros(2)}, 7, "full")
    assert owner.stats["weight_version"] == 3


@pytest.mark.slow
def test_the_trainer_hands_its_server_a_secret_no_other_process_has(tmp_path):
    cfg = load_config(["recipe=tiny_sd3_flowgrpo", "rollout.backend=server", "rollout.backend_options.server_timeout_s=60",
                       f"trainer.output_dir={tmp_path / 'run'}"])
    from omni_rl.models import build_model

    torch.manual_seed(cfg.trainer.seed)
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    engine = start_server_engine(cfg, model, cfg.rollout.backend_options)
    try:
        assert engine.token and len(engine.token) >= 32
        for method, path in (("POST", "/shutdown"), ("POST", "/update_weights"), ("POST", "/generate")):
            status, _ = _raw(engine.url, method, path, b"", {"Content-Type": CONTENT_TYPE})
            assert status == 401, (path, status)
        time.sleep(0.5)
        assert engine.process.poll() is None  # /shutdown without the token did not stop it
        (res,) = engine.generate([_req(height=cfg.rollout.sampling_options.height, width=cfg.rollout.sampling_options.width)], timeout_s=120)
        assert res.weight_version == 0
    finally:
        engine.close()
    assert engine.process.poll() is not None  # the owner's /shutdown did


# --- a bad request is refused to its sender alone ----------------------------------------------
@pytest.fixture
def native(make_sd3):
    server = _serve(NativeDiffusionEngine(make_sd3(), max_num_seqs=4, max_wait_ms=0))
    yield server
    server.engine.close()
    server.stop()


BAD_REQUESTS = {
    "unknown kernel": (dict(kernel="no_such_kernel"), "kernel='no_such_kernel'"),
    "seed past 2**64": (dict(seed=2**64), "seed=18446744073709551616"),
    "noise_level inf": (dict(noise_level=math.inf), "noise_level=inf"),
    "guidance NaN": (dict(guidance_scale=math.nan), "guidance_scale=nan"),
    "images on text-to-image": (dict(images=(torch.zeros(32, 32, 3, dtype=torch.uint8),)), "text-to-image"),
    "size past the position embedding": (dict(height=1024, width=32), "position embedding"),
    "a 2 MB prompt": (dict(prompt="a" * 2_000_000), "prompt has 2,000,000 characters; expected at most 1,000,000"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_request_is_a_400_to_its_sender_and_the_engine_keeps_serving(native, case):
    overrides, message = BAD_REQUESTS[case]
    client = ServerRolloutEngine(native.url, timeout_s=60, token=TOKEN)
    with pytest.raises(RolloutEngineError, match="HTTP 400") as err:
        client.generate([_req(**overrides)], timeout_s=60)
    assert message in str(err.value), str(err.value)
    assert client._json("GET", "/health", what="checking its health")["status"] == "ok"
    (res,) = client.generate([_req(seed=5)], timeout_s=120)
    assert res.final_latent.isfinite().all()
    assert client.stats["refused_requests"] == 1


def test_health_reports_an_engine_that_cannot_sample(make_sd3):
    server = _serve(NativeDiffusionEngine(make_sd3(), max_num_seqs=2, max_wait_ms=0))
    try:
        client = ServerRolloutEngine(server.url, timeout_s=10, token=TOKEN)
        assert client._json("GET", "/health", what="checking its health")["status"] == "ok"
        server.engine.close()
        with pytest.raises(RolloutEngineError, match=r"HTTP 503: the rollout engine cannot sample any more: it is closed"):
            client._json("GET", "/health", what="checking its health")
    finally:
        server.stop()


# --- bounds ------------------------------------------------------------------------------------
def test_a_body_past_the_cap_is_413():
    server = _serve(_EchoEngine(), max_body_bytes=1000)
    try:
        client = ServerRolloutEngine(server.url, timeout_s=10, token=TOKEN)
        with pytest.raises(RolloutEngineError, match="HTTP 413: the body is \\d+ bytes; this server takes at most 1000"):
            client.update_weights({"w": torch.zeros(10_000)}, 1, "full")
        assert client.stats["weight_version"] == 0
    finally:
        server.stop()


def _st(header: bytes, length: int | None = None) -> bytes:
    """A body with a safetensors length prefix (`length`, default the header's own) and `header`."""
    return (len(header) if length is None else length).to_bytes(8, "little") + header


@pytest.mark.parametrize("body, expected", [
    (_st(b"[1,2,3]"), "not a JSON object"),
    (_st(b"{}", length=2**63), "truncated or not safetensors"),
    (_st(b'{"a":'), "not JSON"),
    (_st(b'{"__metadata__": [1, 2, 3]}'), "object __metadata__"),
    (_st(b'{"__metadata__": {"message": 3}}'), "values must be strings"),
    (_st(b"\xff\xfe"), "not JSON"),
])
def test_a_malformed_safetensors_header_is_400(echo, body, expected):
    for path in ("/generate", "/update_weights"):
        status, reply = _raw(echo.url, "POST", path, body, {"Content-Type": CONTENT_TYPE, **auth_headers(TOKEN)})
        assert status == 400 and expected in json.loads(reply)["error"], (path, status, reply)


def test_deeply_nested_json_is_400_not_a_recursion(echo):
    from safetensors.torch import save

    deep = "[" * 100_000 + "]" * 100_000
    status, reply = _raw(echo.url, "POST", "/generate", save({}, metadata={"message": deep}),
                         {"Content-Type": CONTENT_TYPE, **auth_headers(TOKEN)})
    assert status == 400 and "nests deeper than" in json.loads(reply)["error"]
    client = ServerRolloutEngine(echo.url, timeout_s=10, token=TOKEN)
    assert client._json("GET", "/health", what="checking its health")["status"] == "ok"


def test_a_trickling_or_idle_client_is_cut_off(echo, monkeypatch):
    monkeypatch.setattr(_Handler, "timeout", 1.0)
    monkeypatch.setattr(_Handler, "body_deadline_s", 2.0)
    host, port = echo.server_address[:2]
    # Trickling: the headers, then one body byte every 0.5 s (each read is within the idle timeout).
    with socket.create_connection((host, port), timeout=30) as sock:
        head = (f"POST /generate HTTP/1.1\r\nHost: x\r\n{PROTOCOL_HEADER}: 1\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: {CONTENT_TYPE}\r\nContent-Length: 1000\r\n\r\n")
        sock.sendall(head.encode())
        answer = b""
        for _ in range(40):
            try:
                sock.sendall(b"x")
            except OSError:
                break
            sock.settimeout(0.5)
            try:
                chunk = sock.recv(4096)
            except socket.timeout:
                continue
            if not chunk:
                break
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    # Idle: a connection that sends nothing is closed.
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.settimeout(10)
        assert sock.recv(10) == b""


def test_the_command_line_says_one_line_for_a_missing_config_or_a_port_in_use(tmp_path, capsys):
    assert serve.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the following arguments are required: --config"), err
    assert serve.main(["--config", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.yaml" in err[0] and "no such file" in err[0], err

    config = tmp_path / "run.yaml"
    config.write_text(to_yaml(load_config(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={tmp_path / 'r'}"])))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert serve.main(["--config", str(config), "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: cannot listen on 127.0.0.1:{port}: the port is in use; stop what holds it or "
                       f"pick another --port (0 = a free one)"), err


@pytest.mark.slow
def test_a_run_is_unaffected_by_a_local_process_without_its_token(tmp_path):
    from omni_rl.trainer import PPOTrainer

    trainer = PPOTrainer(load_config([
        "recipe=tiny_sd3_flowgrpo", "rollout.backend=server", "rollout.backend_options.server_timeout_s=60", "trainer.total_steps=2",
        "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.mini_batch_size=4",
        "trainer.micro_batch_size=2", "rollout.sampling_options.num_steps=4", "rollout.sampling_options.sde_window_size=2", "rollout.sampling_options.sde_window_range=[0,3]",
        "trainer.val_every=0",
        "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", "trainer.save_every=0",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]))
    url = trainer.rollout_engine.url
    answers, stop = [], threading.Event()
    weights = encode_weights({"w": torch.zeros(2)}, 99, "full", 0, True)

    def attack():
        while not stop.is_set():
            for path, body in (("/shutdown", b""), ("/update_weights", weights), ("/generate", b""), ("/sleep", b"")):
                try:
                    answers.append(_raw(url, "POST", path, body, {"Content-Type": CONTENT_TYPE}, timeout=10)[0])
                except OSError:
                    answers.append("no connection")
            time.sleep(0.05)

    attacker = threading.Thread(target=attack, daemon=True)
    close = trainer.rollout_engine.close

    def close_after_the_attack():  # the run's own shutdown, once the attacker has stopped
        stop.set()
        attacker.join(timeout=30)
        close()

    trainer.rollout_engine.close = close_after_the_attack
    attacker.start()
    try:
        trainer.fit()
    finally:
        stop.set()
        attacker.join(timeout=30)
    assert answers and set(answers) == {401}, sorted(set(map(str, answers)))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(math.isfinite(r["reward/total/mean"]) for r in records)
    # The trainer's own /shutdown at the end stopped it (the attacker's never did: the run finished).
    assert trainer.rollout_engine.process.wait(timeout=30) == 0


def test_a_hand_started_server_writes_its_token_0600_and_prints_where_never_what(tmp_path):
    # Issue 45, L9: its stdout is often a log that others can read (umask 022), so the first line
    # names the token's file, not the token; the file is the owner's only and goes with the server.
    import os
    import select
    import stat
    import subprocess
    import sys
    from pathlib import Path

    from omni_rl.rollout.server.protocol import TOKEN_ENV

    config = tmp_path / "run.yaml"
    config.write_text(to_yaml(load_config(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={tmp_path / 'r'}"])))
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop(TOKEN_ENV, None)
    process = subprocess.Popen([sys.executable, "-m", "omni_rl.rollout.server", "--config", str(config)], cwd=tmp_path,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, umask=0o022)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 300)
        assert ready, "the server printed nothing within 300 s"
        first = json.loads(process.stdout.readline())
        assert "token" not in first and set(first) == {"url", "pid", "protocol", "token_file"}, first
        token_file = Path(first["token_file"])
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        written = json.loads(token_file.read_text())
        token = written["token"]
        assert written["url"] == first["url"]
        client = ServerRolloutEngine(first["url"], timeout_s=30, token=token, pid=first["pid"])
        assert client._json("GET", "/health", what="checking its health")["status"] == "ok"
        assert _raw(first["url"], "GET", "/health")[0] == 401
    finally:
        process.terminate()  # SIGTERM: it stops and removes the file it wrote
        out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err.decode()[-2000:]
    assert token.encode() not in out + err
    assert not token_file.exists()

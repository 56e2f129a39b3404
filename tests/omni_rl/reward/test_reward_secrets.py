"""Where the reward server's token goes (issue 45, M2 and L9): never a command line, a file others
can read, or a server it was not issued for; never over plain HTTP outside loopback unless the
recipe says so; a hand-started server says where its token is, not the token."""
from __future__ import annotations

import json
import os
import select
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from omni_rl.reward import build_reward
from omni_rl.reward import server as server_module
from omni_rl.reward.http_client import RewardServerError, ScoreClient
from omni_rl.reward.protocol import TOKEN_ENV, TOKEN_URL_ENV
from omni_rl.reward.registry import RewardConfigError, check_reward_files, check_reward_options
from omni_rl.reward.server import running_server
from omni_rl.utils.http_transport import new_token
from omni_rl.utils.token_files import write_token_file
from rewards.latent_scorers import latent_stats

FAST = dict(timeout_s=10, retries=0, backoff_s=0.0)
ROOT = Path(__file__).resolve().parents[3]  # the checkout, so its omni_rl is the one imported
OUTSIDE = "http://192.0.2.1:8000"  # TEST-NET-1: refused from its text, never connected to


@pytest.fixture(autouse=True)
def _no_token_in_the_environment(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_URL_ENV, raising=False)


class _Listener:
    """A bare loopback socket server that records the bytes of every request and answers each
    with one score: a stranger's server a recipe might name."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    head, _, rest = data.partition(b"\r\n\r\n")
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)
                    while len(rest) < length:
                        rest += conn.recv(65536)
                    self.received.append(head + b"\r\n\r\n" + rest)
                    body = b'{"scores": [0.5], "protocol": 1}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                                 b"Connection: close\r\n\r\n" % len(body) + body)
                except OSError:
                    pass

    def close(self):
        try:  # wakes the thread's accept() (closing the socket alone leaves it blocked on Linux)
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(timeout=10)


@pytest.fixture
def stranger():
    listener = _Listener()
    yield listener
    listener.close()


def test_a_token_bound_to_its_server_is_never_sent_to_another(monkeypatch, stranger):
    token = new_token()
    with running_server(latent_stats(), token=token) as (_, url):
        monkeypatch.setenv(TOKEN_ENV, token)
        monkeypatch.setenv(TOKEN_URL_ENV, url)
        latents = torch.zeros(1, 4)
        assert build_reward("latent_http", url=url, **FAST)(latents, ["p"], [{}]) == [0.0]  # its own server
        assert build_reward("latent_http", url=stranger.url, **FAST)(latents, ["p"], [{}]) == [0.5]
    (request,) = stranger.received
    assert b"POST /score " in request and token.encode() not in request
    assert b"authorization" not in request.lower()


def test_a_token_file_is_for_its_server_only_and_refused_for_another(tmp_path, stranger):
    token = new_token()
    with running_server(latent_stats(), token=token) as (_, url):
        path = write_token_file(str(tmp_path / "reward.token"), token, url)
        latents = torch.zeros(2, 4)
        assert build_reward("latent_http", url=url, token_file=path, **FAST)(latents, ["a", "b"], [{}, {}]) == [0.0, 0.0]
        check_reward_files("latent_http", {"url": url, "token_file": path})
        for name in ("latent_http", "http_scorer", "vlm_edit_judge"):
            with pytest.raises(RewardConfigError, match=f"reward '{name}': token_file '{path}' is for {url}, not for "
                                                        f"url='{stranger.url}': a token is sent only to the server "
                                                        f"it was issued for"):
                check_reward_files(name, {"url": stranger.url, "token_file": path})
        with pytest.raises(ValueError, match="is for"):
            build_reward("latent_http", url=stranger.url, token_file=path, **FAST)
    assert stranger.received == []  # refused before any connection


def test_a_token_without_the_url_it_is_for_is_refused_at_load(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, new_token())
    with pytest.raises(RewardConfigError, match=f"reward 'http_scorer': {TOKEN_ENV} is set but {TOKEN_URL_ENV} is "
                                                f"not: a token is sent only to the server it was issued for"):
        check_reward_options("http_scorer", {"url": "http://127.0.0.1:8000"})


def test_a_token_file_others_can_read_is_refused_naming_its_mode(tmp_path):
    path = write_token_file(str(tmp_path / "reward.token"), new_token(), "http://127.0.0.1:8000")
    os.chmod(path, 0o644)
    with pytest.raises(RewardConfigError, match=r"token file .* has mode 0644: other local users can read the token"):
        check_reward_files("latent_http", {"url": "http://127.0.0.1:8000", "token_file": path})


def test_plain_http_outside_loopback_is_one_error_line_at_load_unless_allowed(capsys):
    from omni_rl.cli import main

    override = f"reward.rewards=[{{name: http_scorer, reward_options: {{url: '{OUTSIDE}'}}}}]"
    assert main([override, "--cfg"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: reward.rewards[0].reward_options: reward 'http_scorer': url='{OUTSIDE}' is plain HTTP to '192.0.2.1', a "
        f"host outside loopback"), lines
    assert "allow_insecure_remote: true" in lines[0]
    for name in ("http_scorer", "latent_http", "vlm_edit_judge"):
        with pytest.raises(RewardConfigError, match="is plain HTTP to 'judge.example.org'"):
            check_reward_options(name, {"url": "http://judge.example.org:8000"})  # a name is not resolved
        with pytest.raises(ValueError, match="plain HTTP"):
            build_reward(name, url=OUTSIDE)
        check_reward_options(name, {"url": OUTSIDE, "allow_insecure_remote": True})  # said explicitly
        check_reward_options(name, {"url": "https://192.0.2.1:8443"})
        check_reward_options(name, {"url": "http://localhost:8000"})
        check_reward_options(name, {"url": "http://[::1]:8000"})
    with pytest.raises(RewardConfigError, match="allow_insecure_remote='yes'; expected true or false"):
        check_reward_options("latent_http", {"url": OUTSIDE, "allow_insecure_remote": "yes"})


def test_a_401_without_a_token_says_how_to_give_one():
    with running_server(latent_stats(), token=new_token()) as (_, url):
        with pytest.raises(RewardServerError, match=f"this client sent no token: give the reward token_file: PATH "
                                                    f".* or set {TOKEN_URL_ENV}={url} with {TOKEN_ENV}"):
            ScoreClient(url, **FAST).score(torch.zeros(1, 4), ["p"], [{}], kind="latents")


def test_the_server_reads_a_token_file_or_the_environment_and_says_where_not_what(tmp_path, monkeypatch):
    token = new_token()
    monkeypatch.setenv(TOKEN_ENV, token)
    server = server_module.server_from_args(["--scorer", "latent_stats"])
    try:
        assert server.token == token and server.token_source == f"the environment variable {TOKEN_ENV}"
        assert TOKEN_ENV not in os.environ  # nothing the scorer starts inherits it
    finally:
        server.server_close()
    path = str(tmp_path / "t.json")
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    write_token_file(path, token, f"http://127.0.0.1:{port}")
    server = server_module.server_from_args(["--scorer", "latent_stats", "--port", str(port), "--token-file", path])
    try:
        assert server.token == token and server.token_source == f"{path} (mode 0600)"
    finally:
        server.server_close()


@pytest.mark.parametrize("argv, match", [
    (["--token-file", "{path}"], "--token-file {path!r} is for http://127.0.0.1:1, and this server would listen on "
                                 "127.0.0.1:(a free port)"),
    (["--token-file", "{missing}/t.json"], "the folder {missing!r} does not exist"),
])
def test_a_token_file_that_cannot_serve_is_one_error_line(tmp_path, capsys, argv, match):
    path = write_token_file(str(tmp_path / "t.json"), new_token(), "http://127.0.0.1:1")
    missing = str(tmp_path / "nope")
    argv = [a.format(path=path, missing=missing) for a in argv]
    assert server_module.main(["--scorer", "latent_stats", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and match.format(path=path, missing=missing) in lines[0], lines
    os.chmod(path, 0o640)
    assert server_module.main(["--scorer", "latent_stats", "--token-file", path]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --token-file: token file ") and "has mode 0640" in line


def test_a_hand_started_server_writes_its_token_0600_and_prints_where_never_what(tmp_path):
    path = tmp_path / "reward.token"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(TOKEN_ENV, None)
    process = subprocess.Popen(
        [sys.executable, "-m", "omni_rl.reward.server", "--scorer", "latent_stats", "--token-file", str(path)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, umask=0o022,
    )
    try:
        ready, _, _ = select.select([process.stdout], [], [], 300)
        assert ready, "the server printed nothing within 300 s"
        first = process.stdout.readline().decode()
        assert f"; token: {path} (written now, mode 0600)" in first, first
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        written = json.loads(path.read_text())
        url = first.split(" at ")[1].split(" ")[0]
        assert written["url"] == url
        assert written["token"] not in first
        assert written["token"].encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes()
        scores = ScoreClient(url, token_file=str(path), **FAST).score(torch.zeros(1, 4), ["p"], [{}], kind="latents")
        assert scores == [0.0]
    finally:
        process.terminate()
        out, err = process.communicate(timeout=120)
    assert written["token"].encode() not in out + err

"""The reward protocol on the shared transport (issue 29, items 4 and 6): a server given a token
answers 401 to a request without it and scores nothing; the client sends the token from
`OMNI_RL_REWARD_TOKEN`; the client reads a bounded answer and never echoes raw bytes of a junk
one; nested JSON is refused without recursion."""
from __future__ import annotations

import socket
import threading

import pytest
import torch

from omni_rl.reward import server as server_module
from omni_rl.reward.http_client import RewardServerError, ScoreClient
from omni_rl.reward.protocol import TOKEN_ENV, TOKEN_URL_ENV, decode_response, error_message
from omni_rl.reward.server import OneKindScorer, running_server
from rewards.latent_scorers import latent_stats
from omni_rl.utils.http_transport import check_json_depth, new_token, printable, safe_preview

FAST = dict(timeout_s=10, retries=0, backoff_s=0.0)


def _counting_scorer():
    calls = []
    inner = latent_stats()

    class Counting(OneKindScorer):
        accepts = "latents"

        def __call__(self, latents, prompts, metadata):
            calls.append(len(prompts))
            return inner(latents, prompts, metadata)

    return Counting(), calls


def test_a_request_without_the_token_gets_401_and_is_not_scored(monkeypatch):
    token = new_token()
    scorer, calls = _counting_scorer()
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with running_server(scorer, token=token) as (_, url):
        latents = torch.zeros(2, 4)
        for client in (ScoreClient(url, **FAST), ScoreClient(url, token="x" * 32, **FAST)):
            with pytest.raises(RewardServerError, match="HTTP 401: missing or wrong Authorization") as err:
                client.score(latents, ["a", "b"], [{}, {}], kind="latents")
            assert err.value.attempts == 1  # a 401 is not retried
            with pytest.raises(RewardServerError, match="HTTP 401"):
                client.health()
        assert calls == []
        assert ScoreClient(url, token=token, **FAST).score(latents, ["a", "b"], [{}, {}], kind="latents") == [0.0, 0.0]
        monkeypatch.setenv(TOKEN_ENV, token)  # how http_scorer / latent_http get it,
        monkeypatch.setenv(TOKEN_URL_ENV, url)  # bound to the server it is for (issue 45, M2)
        assert ScoreClient(url, **FAST).health()["status"] == "ok"
    assert calls == [2]


def test_the_command_line_refuses_a_token_and_takes_one_from_the_environment(monkeypatch, capsys):
    # Issue 45, M2: --token (every local user reads a command line) is refused, whatever its
    # length, without repeating it; the environment's token is checked for length instead.
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    token = new_token()
    for value in ("short", token):
        assert server_module.main(["--scorer", "latent_stats", "--token", value]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("error: --token puts the secret on the command line, where every local user can "
                               "read it"), line
        assert f"environment variable {TOKEN_ENV}" in line and "--token-file PATH" in line and value not in line
    monkeypatch.setenv(TOKEN_ENV, "short")
    assert server_module.main(["--scorer", "latent_stats"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: ${TOKEN_ENV} is 5 characters; expected a secret of at least 16")
    monkeypatch.setenv(TOKEN_ENV, token)
    server = server_module.server_from_args(["--scorer", "latent_stats"])
    try:
        assert server.token == token
    finally:
        server.server_close()


def _one_shot_server(answer: bytes):
    """A server that answers every connection with the raw bytes `answer` (status line included)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    conn.sendall(answer)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_the_client_reads_a_bounded_answer():
    body = b'{"scores": [' + b"0.0, " * 200_000 + b'0.0], "protocol": 1}'
    listener, url = _one_shot_server(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    try:
        with pytest.raises(RewardServerError, match=r"this client reads at most 4096"):
            ScoreClient(url, max_reply_bytes=4096, **FAST).score(torch.zeros(1, 4), ["p"], [{}], kind="latents")
    finally:
        listener.close()


def test_a_junk_answer_is_escaped_and_cut_never_echoed_raw():
    junk = b"\x1b]0;owned\x07\x1b[2J" + bytes(range(256)) * 10
    listener, url = _one_shot_server(b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n" % len(junk) + junk)
    try:
        with pytest.raises(RewardServerError) as err:
            ScoreClient(url, **FAST).score(torch.zeros(1, 4), ["p"], [{}], kind="latents")
    finally:
        listener.close()
    text = str(err.value)
    assert "\x1b" not in text and "\x07" not in text and "\\x1b" in text and len(text) < 600, text
    # An error sentence of our own protocol is shown as it is, control characters escaped.
    assert error_message(b'{"error": "bad \\u001b[2J thing", "protocol": 1}') == "bad \\x1b[2J thing"
    assert printable("x" * 1000).endswith("... (1000 characters)")
    assert safe_preview(b"\x00\xff") == repr("\x00\ufffd")


def test_deeply_nested_json_is_refused_without_recursion():
    deep = b"[" * 200_000 + b"]" * 200_000
    with pytest.raises(ValueError, match="nests deeper than 64 levels"):
        check_json_depth(deep)
    check_json_depth('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}')  # in a string
    from omni_rl.reward.protocol import ProtocolError

    with pytest.raises(ProtocolError, match="not JSON"):
        decode_response(deep, 1)
    assert error_message(deep).startswith("'[[[[")


def test_http_scorer_and_latent_http_are_one_client_class():
    from omni_rl.reward import build_reward
    from omni_rl.reward.http_client import RemoteScorer

    images = build_reward("http_scorer", url="http://127.0.0.1:9")
    latents = build_reward("latent_http", url="http://127.0.0.1:9")
    assert type(images) is RemoteScorer and type(latents) is RemoteScorer
    assert (images.kind, latents.kind) == ("images", "latents")
    assert images.url == latents.url == "http://127.0.0.1:9/score"


def test_an_oversized_answer_is_one_error_without_retries_naming_the_limit():
    # Issue 45, N17: the same request brings the same answer, so retrying it only multiplies the
    # wait, and "raise timeout_s/retries" was the wrong advice.
    body = b'{"scores": [' + b"0.0, " * 2_000 + b'0.0], "protocol": 1}'
    counted = []
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            counted.append(1)
            with conn:
                conn.settimeout(5)
                try:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        client = ScoreClient(url, max_reply_bytes=1024, timeout_s=10, retries=3, backoff_s=0.0)
        with pytest.raises(RewardServerError) as err:
            client.score(torch.zeros(1, 4), ["p"], [{}], kind="latents")
    finally:
        listener.close()
        thread.join(timeout=10)
    message = str(err.value)
    assert err.value.attempts == 1 and counted == [1], (err.value.attempts, counted)
    assert f"the answer is {len(body)} bytes; this client reads at most 1024 (max_reply_bytes); not retried" in message
    assert "raise the reward's max_reply_bytes (now 1024)" in message and "retries" not in message.replace("not retried", "")
    from omni_rl.reward.registry import RewardConfigError, check_reward_options

    with pytest.raises(RewardConfigError, match="max_reply_bytes=0; expected a whole number of bytes >= 1"):
        check_reward_options("latent_http", {"url": url, "max_reply_bytes": 0})
    from omni_rl.reward import build_reward

    assert build_reward("http_scorer", url=url, max_reply_bytes=4096).client.max_reply_bytes == 4096

"""omni_rl/reward/server/ and http_client.py: the reference server and the retrying client,
run for real on 127.0.0.1 (ephemeral ports; every server is stopped by its fixture/finally)."""
import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from omni_rl.reward import build_reward
from omni_rl.reward.http_client import RewardServerError, ScoreClient
from omni_rl.reward.protocol import CONTENT_TYPE, PROTOCOL_HEADER, ProtocolError, encode_request
import omni_rl.reward.server.serve as server_module
from omni_rl.reward.server import (
    HttpStatusError,
    load_scorer,
    make_server,
    running_server,
    serve_in_thread,
    server_from_args,
)
from omni_rl.reward.server import app as server_app
from omni_rl.utils.http_transport import is_loopback
from rewards.latent_scorers import LatentRewardModel, latent_reward_model, latent_stats

FAST = {"backoff_s": 0.01}


def _post(url, body, headers=None, path="/score"):
    host_port = url.removeprefix("http://")
    conn = http.client.HTTPConnection(host_port, timeout=5)
    try:
        conn.request("POST", path, body=body, headers=headers if headers is not None else {
            PROTOCOL_HEADER: "1", "Content-Type": CONTENT_TYPE,
        })
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


class Scripted:
    """A scorer that raises HttpStatusError for each status in `statuses`, then scores -sum."""

    def __init__(self, statuses=()):
        self.statuses = list(statuses)
        self.calls = 0

    def __call__(self, tensor, prompts, metadata):
        self.calls += 1
        if self.statuses:
            status = self.statuses.pop(0)
            raise HttpStatusError(status, f"scripted {status}")
        return [-float(t.double().sum()) for t in tensor]


@pytest.fixture
def stats_url():
    with running_server(latent_stats()) as (_, url):
        yield url


# ---- the server ------------------------------------------------------------------------------


def test_scores_round_trip_and_health(stats_url):
    latents = torch.randn(3, 4, 6, 6)
    client = ScoreClient(stats_url, **FAST)
    assert client.score(latents, ["a", "b", "c"], [{}] * 3, kind="latents") == latent_stats()(latents, [], [])
    assert client.health() == {"status": "ok", "protocol": 1, "scorer": "latent_stats", "accepts": "latents"}
    assert stats_url.startswith("http://127.0.0.1:")


def test_version_mismatch_and_missing_header_are_400_with_a_clear_message(stats_url):
    body = encode_request(torch.zeros(1, 2), ["p"], [{}], kind="latents")
    status, reply = _post(stats_url, body, {PROTOCOL_HEADER: "2", "Content-Type": CONTENT_TYPE})
    assert status == 400
    assert "protocol version mismatch" in reply["error"] and "speaks protocol 1" in reply["error"]
    status, reply = _post(stats_url, body, {"Content-Type": CONTENT_TYPE})
    assert status == 400 and "no X-Omni-RL-Protocol header" in reply["error"]


def test_bad_requests_get_the_right_status(stats_url):
    body = encode_request(torch.zeros(1, 2), ["p"], [{}], kind="latents")
    assert _post(stats_url, body, {PROTOCOL_HEADER: "1", "Content-Type": "application/json"})[0] == 415
    assert _post(stats_url, body, path="/scores")[0] == 404
    status, reply = _post(stats_url, b"not safetensors at all")
    assert status == 400 and "safetensors" in reply["error"]
    images = encode_request(torch.zeros(1, 4, 4, 3, dtype=torch.uint8), ["p"], [{}], kind="images")
    status, reply = _post(stats_url, images)
    assert status == 400 and "takes 'latents'; the request sent 'images'" in reply["error"]
    with pytest.raises(RewardServerError, match="HTTP 404"):
        ScoreClient(stats_url + "/nowhere").health()


def test_body_size_limit_is_413():
    with running_server(latent_stats(), max_body_bytes=100) as (_, url):
        status, reply = _post(url, encode_request(torch.zeros(1, 64), ["p"], [{}], kind="latents"))
    assert status == 413 and "at most 100" in reply["error"]


@pytest.fixture
def posts(monkeypatch):
    """Counts the POST requests the reference server receives."""
    seen = []
    original = server_app._Handler.do_POST
    monkeypatch.setattr(server_app._Handler, "do_POST", lambda self: seen.append(self.path) or original(self))
    return seen


def test_a_body_over_the_limit_gets_the_413_once_not_a_broken_pipe_retried(posts):
    big = torch.zeros(1, 1 << 20)  # a 4 MiB body: the server answers long before it is sent
    with running_server(latent_stats(), max_body_bytes=1000) as (_, url):
        status, reply = _post(url, encode_request(big, ["p"], [{}], kind="latents"))  # a client sending it all
        assert status == 413 and "this server takes at most 1000" in reply["error"]
        posts.clear()
        with pytest.raises(RewardServerError) as info:
            ScoreClient(url, retries=3, **FAST).score(big, ["p"], [{}], kind="latents")
    assert info.value.status == 413 and info.value.attempts == 1 and len(posts) == 1
    assert re.search(r"HTTP 413: the body is \d+ bytes; this server takes at most 1000 \(send smaller batches\)\) "
                     r"after 1 attempt\(s\); HTTP 413 is not retried", str(info.value))


def _raw_body(kind, tensor, n):
    from safetensors.torch import save

    return save({kind: tensor}, metadata={"prompts": json.dumps(["p"] * n), "metadata": json.dumps([{}] * n)})


@pytest.mark.parametrize(
    "kind, tensor, match",
    [
        ("latents", torch.tensor([[0.0, 1.0], [float("nan"), 0.0], [float("inf"), 1.0]]),
         r"latents hold NaN or inf values in sample\(s\) 1, 2 of 3"),
        ("images", torch.zeros(1, 0, 0, 3, dtype=torch.uint8), r"images have shape \(1, 0, 0, 3\), with a dim of size 0"),
        ("latents", torch.zeros(2, 0), r"latents have shape \(2, 0\), with a dim of size 0"),
    ],
)
def test_nan_latents_and_empty_images_are_a_400_not_retried(posts, kind, tensor, match):
    scorer = Scripted()
    with running_server(scorer) as (_, url):
        with pytest.raises(RewardServerError, match=r"HTTP 400: the request: " + match) as info:
            ScoreClient(url, retries=3, **FAST).post_score(_raw_body(kind, tensor, len(tensor)), len(tensor))
    assert info.value.attempts == 1 and len(posts) == 1 and scorer.calls == 0
    with pytest.raises(ProtocolError, match="the tensor to send: " + match):  # the client refuses to send them
        encode_request(tensor, ["p"] * len(tensor), [{}] * len(tensor), kind=kind)


@pytest.mark.parametrize(
    "scores, match",
    [([1.0], "returned 1 scores for a batch of 2"), ([1.0, float("nan")], "non-finite score nan at sample index 1")],
)
def test_a_bad_scorer_output_is_a_500_not_a_zero(scores, match):
    with running_server(lambda tensor, prompts, metadata: scores) as (_, url):
        status, reply = _post(url, encode_request(torch.zeros(2, 2), ["p", "q"], [{}, {}], kind="latents"))
    assert status == 500 and match in reply["error"]


def test_a_raising_scorer_is_a_500_and_the_server_keeps_serving():
    calls = []

    def scorer(tensor, prompts, metadata):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory (pretend)")
        return [0.5]

    body = encode_request(torch.zeros(1, 2), ["p"], [{}], kind="latents")
    with running_server(scorer) as (_, url):
        status, reply = _post(url, body)
        assert status == 500 and reply["error"] == "the scorer raised RuntimeError: CUDA out of memory (pretend)"
        assert _post(url, body) == (200, {"scores": [0.5], "protocol": 1})


def test_refuses_a_non_loopback_host_unless_asked():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("127.3.4.5")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("example.com")
    for host in ("0.0.0.0", "10.1.2.3", "example.com"):
        with pytest.raises(ValueError, match="not a loopback address.*allow_remote=True"):
            make_server(latent_stats(), host)
    with pytest.raises(ValueError, match="not a loopback address"):
        serve_in_thread(latent_stats(), host="0.0.0.0")


def test_restart_on_the_same_port():
    server, url = serve_in_thread(latent_stats())
    port = server.server_address[1]
    server.stop()
    with running_server(latent_stats(), port=port) as (_, url_again):
        assert url_again == url
        assert ScoreClient(url).health()["status"] == "ok"


def test_load_scorer_specs():
    latents = torch.randn(2, 3, 4, 4)
    assert load_scorer("latent_stats")(latents, [], []) == latent_stats()(latents, [], [])
    assert load_scorer("rewards.latent_scorers:latent_stats")(latents, [], []) == latent_stats()(latents, [], [])
    model_scorer = load_scorer("latent_reward_model", {"in_channels": 3, "hidden": 4, "seed": 1})
    assert model_scorer(latents, [], []) == latent_reward_model(in_channels=3, hidden=4, seed=1)(latents, [], [])
    images = torch.full((1, 2, 2, 3), 255, dtype=torch.uint8)
    assert load_scorer("reward:brightness")(images, ["p"], [{}]) == [1.0]
    with pytest.raises(ValueError, match="expected a built-in name"):
        load_scorer("no_such_scorer")
    with pytest.raises(ValueError, match="module 'no_such_module_xyz' could not be imported"):
        load_scorer("no_such_module_xyz:make")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        load_scorer("omni_rl.reward.server:nope")


def test_command_line_builds_a_loopback_server_and_serves():
    server = server_from_args(["--scorer", "latent_reward_model", "--kwargs", '{"in_channels": 4, "hidden": 8}'])
    server.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    server.thread.start()
    try:
        assert server.url.startswith("http://127.0.0.1:")
        latents = torch.randn(2, 4, 8, 8)
        scores = ScoreClient(server.url, **FAST).score(latents, ["a", "b"], [{}, {}], kind="latents")
        assert scores == latent_reward_model(in_channels=4, hidden=8)(latents, [], [])
    finally:
        server.stop()


def test_command_line_allows_another_host_only_when_given(monkeypatch):
    calls = []
    monkeypatch.setattr(server_module, "make_server", lambda *args, **kwargs: calls.append((args[1:], kwargs)))
    server_from_args(["--scorer", "latent_stats", "--port", "8123"])
    server_from_args(["--scorer", "latent_stats", "--host", "0.0.0.0"])  # recorded, never bound
    assert calls[0][0] == ("127.0.0.1", 8123) and calls[0][1]["allow_remote"] is False
    assert calls[1][0] == ("0.0.0.0", 0) and calls[1][1]["allow_remote"] is True
    with pytest.raises(SystemExit):
        server_from_args(["--scorer", "latent_stats", "--kwargs", "[1]"])


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--scorer", "nosuch"], "--scorer 'nosuch': expected a built-in name (latent_stats, latent_reward_model)"),
        (["--scorer", "reward:nosuch"], "--scorer 'reward:nosuch': unknown reward 'nosuch'; registered: "),
        (["--scorer", "nosuch_module_xyz:make"], "module 'nosuch_module_xyz' could not be imported"),
        (["--scorer", "latent_stats", "--kwargs", "{bad"], "--kwargs '{bad' is not JSON"),
        (["--scorer", "latent_stats", "--kwargs", "[1]"], "--kwargs '[1]' is a JSON list; expected an object"),
        (["--scorer", "latent_reward_model", "--kwargs", '{"nope": 1}'],
         "got an unexpected keyword argument 'nope'; accepted options: path, in_channels, hidden, seed"),
        (["--scorer", "reward:brightness", "--kwargs", '{"nope": 1}'], "reward 'brightness' got unknown option(s) 'nope'"),
        (["--scorer", "latent_reward_model", "--kwargs", '{"in_channels": 0}'], "in_channels=0; expected an int >= 1"),
        (["--scorer", "latent_reward_model", "--kwargs", '{"path": "/nonexistent/lrm.safetensors"}'],
         "FileNotFoundError: No such file or directory: /nonexistent/lrm.safetensors"),
        (["--scorer", "latent_stats", "--port", "99999"], "argument --port: 99999 is out of range; expected a port 0..65535"),
        (["--scorer", "latent_stats", "--port", "http"], "argument --port: 'http' is not an integer"),
        (["--scorer", "latent_stats", "--max-body-bytes", "0"], "argument --max-body-bytes: '0'; expected a whole number"),
        ([], "the following arguments are required: --scorer"),
    ],
)
def test_command_line_bad_input_is_one_error_line_and_exit_2(argv, match, capsys):
    assert server_module.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert match in lines[0]


def test_command_line_port_in_use_is_one_error_line_and_exit_1(capsys):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert server_module.main(["--scorer", "latent_stats", "--port", str(port)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: cannot listen on 127.0.0.1:{port}: the port is in use; stop what holds it or pick "
                     f"another --port (0 = a free one)"]


def test_command_line_error_without_a_traceback_in_a_real_process():
    root = Path(__file__).resolve().parents[3]  # the checkout, so its omni_rl is the one imported
    done = subprocess.run(
        [sys.executable, "-m", "omni_rl.reward.server", "--scorer", "nosuch"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --scorer 'nosuch': expected a built-in name (latent_stats, latent_reward_model), "
        "'module:factory' or 'reward:NAME'"
    ]


# ---- the latent reward model ------------------------------------------------------------------


def test_latent_reward_model_save_load_and_batching(tmp_path):
    scorer = latent_reward_model(in_channels=4, hidden=8, seed=3)
    latents = torch.randn(5, 4, 16, 16)
    batched = scorer(latents, [], [])
    singles = [scorer(latents[i : i + 1], [], [])[0] for i in range(5)]
    assert batched == pytest.approx(singles, abs=1e-5)
    assert latent_reward_model(in_channels=4, hidden=8, seed=3)(latents, [], []) == batched  # seeded
    assert latent_reward_model(in_channels=4, hidden=8, seed=4)(latents, [], []) != batched

    path = str(tmp_path / "lrm.safetensors")
    scorer.model.save_safetensors(path)
    assert latent_reward_model(path=path)(latents, [], []) == batched
    with pytest.raises(HttpStatusError, match=r"takes latents \[B, 4, H, W\]; got shape \(5, 3, 16, 16\)"):
        scorer(torch.randn(5, 3, 16, 16), [], [])
    with pytest.raises(ValueError, match=r"takes latents \[B, 4, H, W\]"):
        scorer.model(torch.randn(2, 4, 3, 8, 8))


def test_latent_reward_model_refuses_a_foreign_file(tmp_path):
    from safetensors.torch import save_file

    path = str(tmp_path / "other.safetensors")
    save_file({"w": torch.zeros(2)}, path, metadata={"model": "SomethingElse"})
    with pytest.raises(ValueError, match="model='SomethingElse'; expected 'LatentRewardModel'"):
        LatentRewardModel.from_safetensors(path)


# ---- the client: retries, backoff, timeouts --------------------------------------------------


def test_503_twice_then_200_succeeds_after_retries_with_growing_backoff():
    scorer = Scripted([503, 503])
    sleeps = []
    with running_server(scorer) as (_, url):
        client = ScoreClient(url, retries=3, backoff_s=0.01, sleep=sleeps.append, rand=lambda: 1.0)
        assert client.score(torch.ones(2, 3), ["a", "b"], [{}, {}], kind="latents") == [-3.0, -3.0]
    assert scorer.calls == 3
    assert sleeps == [0.01, 0.02]


@pytest.mark.parametrize("status", [408, 429, 500, 502])
def test_transient_statuses_are_retried(status):
    scorer = Scripted([status])
    with running_server(scorer) as (_, url):
        assert ScoreClient(url, **FAST).score(torch.ones(1, 2), ["a"], [{}], kind="latents") == [-2.0]
    assert scorer.calls == 2


@pytest.mark.parametrize("status", [400, 404, 422])
def test_other_4xx_fail_at_once(status):
    scorer = Scripted([status] * 5)
    with running_server(scorer) as (_, url):
        client = ScoreClient(url, retries=5, **FAST)
        with pytest.raises(RewardServerError, match=f"refused the request \\(HTTP {status}: scripted {status}\\) after 1 attempt") as info:
            client.score(torch.ones(1, 2), ["a"], [{}], kind="latents")
    assert scorer.calls == 1
    assert info.value.status == status and info.value.attempts == 1 and info.value.url == url + "/score"


def test_retries_exhausted_raise_naming_url_status_and_attempts():
    with running_server(Scripted([503] * 10)) as (_, url):
        with pytest.raises(RewardServerError) as info:
            ScoreClient(url, retries=2, **FAST).score(torch.ones(1, 2), ["a"], [{}], kind="latents")
    message = str(info.value)
    assert f"{url}/score failed after 3 attempt(s): HTTP 503: scripted 503" in message
    assert info.value.attempts == 3 and info.value.status == 503


def test_connection_refused_is_retried_then_raises():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RewardServerError, match=f"{url}/score failed after 2 attempt\\(s\\): connection error") as info:
        ScoreClient(url, retries=1, **FAST).score(torch.ones(1, 2), ["a"], [{}], kind="latents")
    assert info.value.status is None
    with pytest.raises(RewardServerError, match="is not reachable"):
        ScoreClient(url).health()


def test_timeout_is_honoured():
    release = threading.Event()

    def sleepy(tensor, prompts, metadata):
        release.wait(5)
        return [0.0] * len(prompts)

    server, url = serve_in_thread(sleepy)
    try:
        client = ScoreClient(url, timeout_s=0.2, retries=1, **FAST)
        start = time.monotonic()
        with pytest.raises(RewardServerError, match="failed after 2 attempt\\(s\\): timed out after 0.2 s"):
            client.score(torch.ones(1, 2), ["a"], [{}], kind="latents")
        assert time.monotonic() - start < 2.0
    finally:
        release.set()
        server.stop()



def test_timeout_is_a_deadline_for_the_whole_attempt_not_each_byte(trickling_server):
    # One byte every 0.5 s never trips a 2 s socket timeout; only a deadline cuts it off.
    with trickling_server() as (url, accepted):
        client = ScoreClient(url, timeout_s=2, retries=1, **FAST)
        start = time.monotonic()
        with pytest.raises(RewardServerError) as info:
            client.score(torch.ones(1, 2), ["a"], [{}], kind="latents")
        elapsed = time.monotonic() - start
    assert elapsed < 30, f"a 2 s deadline with one retry took {elapsed:.0f} s"
    assert f"reward server {url}/score failed after 2 attempt(s): timed out after 2 s" in str(info.value)
    assert info.value.status is None and info.value.attempts == 2 and len(accepted) == 2


class _Misbehaving(BaseHTTPRequestHandler):
    reply = b""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.reply)))
        self.end_headers()
        self.wfile.write(self.reply)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "reply, match",
    [
        (b'{"scores": [1.0], "protocol": 1}', "returned 1 scores for a batch of 2"),
        (b'{"scores": [1.0, Infinity], "protocol": 1}', "non-finite score inf at sample index 1"),
        (b'{"scores": [1.0, 2.0]}', '"protocol": None; expected 1'),
    ],
)
def test_a_bad_200_reply_fails_at_once(reply, match):
    handler = type("Handler", (_Misbehaving,), {"reply": reply})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(RewardServerError, match=f"replied 200 with a bad body: .*{match}") as info:
            ScoreClient(url, retries=3, **FAST).score(torch.ones(2, 2), ["a", "b"], [{}, {}], kind="latents")
        assert info.value.attempts == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_backoff_is_exponential_capped_and_jittered():
    client = ScoreClient("http://127.0.0.1:1", backoff_s=0.5, max_backoff_s=3.0, rand=lambda: 0.0)
    assert [client.backoff_delay(k) for k in (1, 2, 3, 4, 5)] == [0.25, 0.5, 1.0, 1.5, 1.5]
    client = ScoreClient("http://127.0.0.1:1", backoff_s=0.5, max_backoff_s=3.0, rand=lambda: 1.0)
    assert [client.backoff_delay(k) for k in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]


def test_client_urls_and_option_checks():
    client = ScoreClient("http://127.0.0.1:8000/")
    assert client.score_url == "http://127.0.0.1:8000/score" and client.health_url == "http://127.0.0.1:8000/health"
    client = ScoreClient("http://127.0.0.1:8000/prefix/score")
    assert client.score_url == "http://127.0.0.1:8000/prefix/score"
    assert client.health_url == "http://127.0.0.1:8000/prefix/health"
    for url in ("127.0.0.1:8000", "ftp://x", "http://", 8000, "http://127.0.0.1:99999"):
        with pytest.raises(ValueError, match="url="):
            ScoreClient(url)
    for kwargs, match in [
        ({"timeout_s": 0}, "timeout_s=0; expected a finite number > 0"),
        ({"timeout_s": float("inf")}, "timeout_s=inf"),
        ({"retries": -1}, "retries=-1; expected an int >= 0"),
        ({"retries": 1.5}, "retries=1.5"),
        ({"backoff_s": -0.1}, "backoff_s=-0.1; expected a finite number >= 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            ScoreClient("http://127.0.0.1:8000", **kwargs)


def test_a_registered_image_reward_can_be_served_as_it_is():
    brightness = build_reward("brightness")
    images = torch.randint(0, 256, (3, 5, 7, 3), dtype=torch.uint8)
    with running_server(brightness) as (_, url):
        remote = ScoreClient(url).score(images, ["a", "b", "c"], [{}] * 3, kind="images")
    assert remote == brightness(images, ["a", "b", "c"], [{}] * 3)


def test_a_registered_reward_served_by_name_takes_images_only():
    scorer = load_scorer("reward:brightness")
    assert scorer.accepts == "images" and repr(scorer) == "reward:brightness"
    with running_server(scorer) as (_, url):
        assert ScoreClient(url).health()["accepts"] == "images"
        status, reply = _post(url, encode_request(torch.zeros(1, 2), ["p"], [{}], kind="latents"))
        assert status == 400 and "takes 'images'" in reply["error"]


def test_an_input_error_from_the_scorer_is_a_400():
    # an image reward without `accepts` handed 2-channel images: RewardInputError -> 400, not retried
    with running_server(build_reward("brightness")) as (_, url):
        status, reply = _post(url, encode_request(torch.zeros(1, 4, 4, 2, dtype=torch.uint8), ["p"], [{}], kind="images"))
    assert status == 400 and reply["error"].startswith("the scorer refused the batch: images has shape (1, 4, 4, 2)")

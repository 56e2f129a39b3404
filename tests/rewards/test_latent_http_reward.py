"""rewards/latent_http.py: clean latents scored by the reference server, for real on 127.0.0.1."""
import threading
import time

import numpy as np
import pytest
import torch

from omni_rl.reward import RewardConfigError, RewardError, RewardInputError, RewardManager, RewardSpec, build_reward
from omni_rl.reward.http_client import RewardServerError
from omni_rl.reward.server import HttpStatusError, running_server, serve_in_thread
from rewards.latent_scorers import latent_reward_model, latent_stats

FAST = {"backoff_s": 0.01, "retries": 2}


def _images(n, size=8):
    return torch.randint(0, 256, (n, size, size, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))


def _with_latents(latents, **extra):
    return [{"latent": latent, **extra} for latent in latents]


def test_float_samples_are_the_latents():
    latents = torch.randn(3, 4, 6, 6)
    with running_server(latent_stats()) as (_, url):
        scores = build_reward("latent_http", url=url, **FAST)(latents, ["a", "b", "c"], [{}] * 3)
    assert scores == latent_stats()(latents, [], [])
    assert all(isinstance(s, float) for s in scores)


def test_metadata_latents_through_a_manager_match_local_scores():
    latents = torch.randn(4, 4, 8, 8, dtype=torch.bfloat16)  # upcast to float32 on the way
    with running_server(latent_stats()) as (_, url):
        manager = RewardManager([RewardSpec("latent_http", kwargs={"url": url, **FAST})])
        out = manager.score(_images(4), ["p"] * 4, _with_latents(latents))
    expected = latent_stats()(latents.float(), [], [])
    assert out.per_reward["latent_http"].tolist() == pytest.approx(expected, rel=1e-6)
    assert out.metrics["reward/latent_http/mean"] == pytest.approx(float(np.mean(expected)), rel=1e-6)


def test_what_the_server_receives():
    seen = {}

    def recorder(tensor, prompts, metadata):
        seen.update(tensor=tensor, prompts=prompts, metadata=metadata)
        return [0.0] * len(prompts)

    latents = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float16)
    metadata = [{"latent": latents[0], "target": "OPEN", "step": np.int64(7)}, {"latent": latents[1]}]
    with running_server(recorder) as (_, url):
        build_reward("latent_http", url=url)(_images(2), ["a", "b"], metadata)
    assert seen["tensor"].dtype == torch.float32 and seen["tensor"].shape == (2, 3, 4)
    assert torch.equal(seen["tensor"], torch.from_numpy(latents.astype(np.float32)))
    assert seen["prompts"] == ["a", "b"]
    assert seen["metadata"] == [{"target": "OPEN", "step": 7}, {}]  # the latent travels as the tensor


def test_batched_and_one_at_a_time_scores_agree():
    latents = torch.randn(6, 4, 16, 16)
    with running_server(latent_reward_model(in_channels=4, hidden=16, seed=0)) as (_, url):
        reward = build_reward("latent_http", url=url, **FAST)
        batched = reward(latents, ["p"] * 6, [{}] * 6)
        singles = [reward(latents[i : i + 1], ["p"], [{}])[0] for i in range(6)]
    assert batched == pytest.approx(singles, abs=1e-5)


def test_missing_or_mismatched_latents_fail_before_any_request():
    calls = []
    with running_server(lambda *args: calls.append(1) or [0.0]) as (_, url):
        reward = build_reward("latent_http", url=url)
        with pytest.raises(RewardInputError, match=r"metadata\[i\]\['latent'\] is missing for sample\(s\) 1 of 2"):
            reward(_images(2), ["a", "b"], [{"latent": torch.zeros(4)}, {}])
        with pytest.raises(RewardInputError, match=r"different shapes \[\(3,\), \(4,\)\]"):
            reward(_images(2), ["a", "b"], _with_latents([torch.zeros(4), torch.zeros(3)]))
        with pytest.raises(RewardInputError, match=r"metadata\[0\]\['latent'\] is a Tensor torch.int64"):
            reward(_images(1), ["a"], [{"latent": torch.zeros(4, dtype=torch.long)}])
        with pytest.raises(RewardInputError, match="expected a list of 2 prompt strings"):
            reward(torch.zeros(2, 3), ["a"], [{}, {}])
        with pytest.raises(RewardInputError, match=r"float tensor of shape \(3,\)"):
            reward(torch.zeros(3), ["a", "b", "c"], [{}] * 3)
    assert calls == []


def test_nan_latents_fail_at_once_naming_the_samples_without_a_request():
    calls = []
    with running_server(lambda *args: calls.append(1) or [0.0] * 3) as (_, url):
        manager = RewardManager([RewardSpec("latent_http", kwargs={"url": url, **FAST})])
        latents = torch.zeros(3, 4)
        latents[2, 1] = float("nan")
        with pytest.raises(RewardError, match=r"reward 'latent_http' raised ProtocolError: .*NaN or inf values in sample\(s\) 2 of 3"):
            manager.score(_images(3), ["a", "b", "c"], _with_latents(latents))
    assert calls == []


def test_server_killed_mid_run_fails_the_step_then_recovers_on_the_same_port():
    latents = torch.randn(2, 4, 4, 4)
    images, prompts, metadata = _images(2), ["a", "b"], _with_latents(latents)
    server, url = serve_in_thread(latent_stats())
    port = server.server_address[1]
    try:
        manager = RewardManager([RewardSpec("latent_http", kwargs={"url": url, "retries": 1, "backoff_s": 0.01})])
        first = manager.score(images, prompts, metadata)
    finally:
        server.stop()

    with pytest.raises(RewardError) as info:
        manager.score(images, prompts, metadata)
    message = str(info.value)
    assert "reward 'latent_http' raised RewardServerError" in message
    assert f"{url}/score failed after 2 attempt(s): connection error" in message
    assert isinstance(info.value.__cause__, RewardServerError)

    with running_server(latent_stats(), port=port) as (_, url_again):
        assert url_again == url
        again = manager.score(images, prompts, metadata)
    assert torch.equal(again.total, first.total)


def test_an_optional_remote_reward_that_is_down_is_left_out_not_zeroed():
    with running_server(latent_stats()) as (server, url):
        pass  # stopped: nothing listens on url any more
    manager = RewardManager([
        RewardSpec("brightness", weight=1.0),
        RewardSpec("latent_http", weight=1.0, required=False, kwargs={"url": url, "retries": 0}),
    ])
    images = _images(2)
    out = manager.score(images, ["a", "b"], _with_latents(torch.randn(2, 4)))
    assert out.failed == ["latent_http"] and out.metrics["reward/latent_http/failed"] == 1.0
    assert "latent_http" not in out.per_reward
    brightness = build_reward("brightness")(images, ["a", "b"], [{}, {}])
    assert out.total.tolist() == pytest.approx([2 * b for b in brightness])


def test_503_twice_then_200_succeeds():
    answers = [503, 503]

    def flaky(tensor, prompts, metadata):
        if answers:
            raise HttpStatusError(answers.pop(0), "warming up")
        return latent_stats()(tensor, prompts, metadata)

    latents = torch.randn(2, 3)
    with running_server(flaky) as (_, url):
        assert build_reward("latent_http", url=url, **FAST)(latents, ["a", "b"], [{}, {}]) == latent_stats()(latents, [], [])
    assert answers == []


def test_400_fails_at_once():
    calls = []

    def refuses(tensor, prompts, metadata):
        calls.append(1)
        raise HttpStatusError(400, "prompt has no quoted target")

    with running_server(refuses) as (_, url):
        with pytest.raises(RewardServerError, match=r"refused the request \(HTTP 400: prompt has no quoted target\) after 1 attempt"):
            build_reward("latent_http", url=url, retries=5, backoff_s=0.01)(torch.zeros(1, 2), ["a"], [{}])
    assert calls == [1]


def test_timeout_is_honoured():
    release = threading.Event()

    def sleepy(tensor, prompts, metadata):
        release.wait(5)
        return [0.0] * len(prompts)

    server, url = serve_in_thread(sleepy)
    try:
        reward = build_reward("latent_http", url=url, timeout_s=0.2, retries=0)
        start = time.monotonic()
        with pytest.raises(RewardServerError, match="failed after 1 attempt\\(s\\): timed out after 0.2 s"):
            reward(torch.zeros(1, 2), ["a"], [{}])
        assert time.monotonic() - start < 1.5
    finally:
        release.set()
        server.stop()



def test_a_server_that_trickles_bytes_is_cut_off_at_timeout_s_naming_reward_and_url(trickling_server):
    with trickling_server() as (url, _):
        manager = RewardManager([RewardSpec("latent_http", kwargs={"url": url, "timeout_s": 2, "retries": 0})])
        start = time.monotonic()
        with pytest.raises(RewardError) as info:
            manager.score(_images(1), ["a"], _with_latents(torch.zeros(1, 4)))
        elapsed = time.monotonic() - start
    assert elapsed < 30, f"timeout_s=2 with retries=0 took {elapsed:.0f} s"
    message = str(info.value)
    assert "reward 'latent_http' raised RewardServerError" in message
    assert f"reward server {url}/score failed after 1 attempt(s): timed out after 2 s" in message


def test_a_step_that_waits_too_long_for_a_remote_reward_names_it_and_its_url(trickling_server):
    from omni_rl.reward.async_scorer import AsyncRewardScorer

    scorer = None
    try:
        with trickling_server() as (url, _):
            manager = RewardManager([RewardSpec("latent_http", kwargs={"url": url, "timeout_s": 30, "retries": 0})])
            scorer = AsyncRewardScorer(manager, max_batch_size=1, max_wait_ms=1)
            future = scorer.submit(torch.zeros(4, 4, 3, dtype=torch.uint8), "p", {"latent": torch.zeros(4)})
            with pytest.raises(RewardError) as info:
                scorer.gather([future], timeout_s=0.5)
    finally:  # after the server stopped: the hung request then ends at once
        if scorer is not None:
            scorer.close()
    assert f"still running: reward 'latent_http' ({url}/score) for " in str(info.value)


def test_options_are_checked_when_the_reward_is_built():
    with pytest.raises(RewardConfigError, match="missing a required argument: 'url'"):
        build_reward("latent_http")
    with pytest.raises(RewardConfigError, match="unknown option\\(s\\) 'timeout'"):
        build_reward("latent_http", url="http://127.0.0.1:1", timeout=3)
    with pytest.raises(ValueError, match="timeout_s=-1"):
        build_reward("latent_http", url="http://127.0.0.1:1", timeout_s=-1)
    with pytest.raises(ValueError, match="url='localhost:8000'"):
        build_reward("latent_http", url="localhost:8000")


@pytest.mark.parametrize(
    "url, got",
    [("ftp://10.0.0.5:8000", "has the scheme 'ftp'"), ("localhost:8000", "has no scheme"), ("http://", "has no host")],
)
def test_a_bad_url_fails_when_the_options_are_checked_before_any_build(url, got):
    from omni_rl.reward.registry import check_reward_options

    with pytest.raises(RewardConfigError, match=f"reward 'latent_http': url='{url}' {got}"):
        check_reward_options("latent_http", {"url": url})
    check_reward_options("latent_http", {"url": "https://10.0.0.5:8000", "timeout_s": 5})
    with pytest.raises(RewardConfigError, match="reward 'latent_http': timeout_s=0; expected a finite number > 0"):
        check_reward_options("latent_http", {"url": "http://127.0.0.1:1", "timeout_s": 0})


def test_an_ftp_url_is_one_error_line_at_config_load(capsys):
    from omni_rl.cli import main

    override = "reward.rewards=[{name: latent_http, reward_options: {url: 'ftp://10.0.0.5:8000'}}]"
    assert main([override, "--cfg"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "error: reward.rewards[0].reward_options: reward 'latent_http': url='ftp://10.0.0.5:8000' has the scheme 'ftp'; "
        "accepted schemes: http, https (the server's base URL, e.g. 'http://127.0.0.1:8000')"
    ]

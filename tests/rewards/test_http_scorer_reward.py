"""rewards/http_scorer.py: images/video scored by the reference server, for real on 127.0.0.1."""

import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.reward import RewardError, RewardInputError, RewardManager, RewardSpec, build_reward
from omni_rl.reward.http_client import RewardServerError
from omni_rl.reward.server import HttpStatusError, running_server, serve_in_thread
from rewards.latent_scorers import latent_stats

FAST = {"backoff_s": 0.01, "retries": 2}


def _images(n, size=12, seed=0):
    return torch.randint(0, 256, (n, size, size, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_remote_brightness_equals_local_brightness_for_tensors_and_pil():
    brightness = build_reward("brightness")
    images = _images(3)
    prompts, metadata = ["a", "b", "c"], [{}] * 3
    with running_server(brightness) as (_, url):
        reward = build_reward("http_scorer", url=url, **FAST)
        remote = reward(images, prompts, metadata)
        remote_pil = reward([Image.fromarray(a) for a in images.numpy()], prompts, metadata)
    local = brightness(images, prompts, metadata)
    assert remote == local and remote_pil == local


def test_batched_and_one_at_a_time_scores_agree():
    contrast = build_reward("contrast")
    images = _images(5)
    with running_server(contrast) as (_, url):
        reward = build_reward("http_scorer", url=url, **FAST)
        batched = reward(images, ["p"] * 5, [{}] * 5)
        singles = [reward(images[i : i + 1], ["p"], [{}])[0] for i in range(5)]
    assert batched == pytest.approx(singles, abs=1e-5)


def test_what_the_server_receives_grey_video_and_metadata():
    seen = []

    def recorder(tensor, prompts, metadata):
        seen.append((tensor, prompts, metadata))
        return [1.0] * len(prompts)

    grey = torch.randint(0, 256, (2, 4, 5, 1), dtype=torch.uint8)
    video = torch.randint(0, 256, (2, 3, 4, 5, 3), dtype=torch.uint8)
    metadata = [{"target": "OPEN", "latent": torch.zeros(4)}, {"fps": np.float32(8.0)}]
    with running_server(recorder) as (_, url):
        reward = build_reward("http_scorer", url=url)
        assert reward(grey, ["a", "b"], metadata) == [1.0, 1.0]
        assert reward(video, ["a", "b"], metadata) == [1.0, 1.0]
    (grey_sent, prompts, sent_meta), (video_sent, _, _) = seen
    assert torch.equal(grey_sent, grey.expand(2, 4, 5, 3))  # grey -> RGB, as every reward sees it
    assert torch.equal(video_sent, video)
    assert prompts == ["a", "b"] and sent_meta == [{"target": "OPEN"}, {"fps": 8.0}]


def test_bad_images_fail_before_any_request():
    calls = []
    with running_server(lambda *args: calls.append(1) or [0.0]) as (_, url):
        reward = build_reward("http_scorer", url=url)
        with pytest.raises(RewardInputError, match="dtype torch.float32; expected uint8"):
            reward(torch.rand(1, 4, 4, 3), ["a"], [{}])
        with pytest.raises(RewardInputError, match="video has dtype torch.float32"):
            reward(torch.rand(1, 2, 4, 4, 3), ["a"], [{}])
        with pytest.raises(RewardInputError, match="got 2 images but 1 prompts"):
            reward(_images(2), ["a"], [{}, {}])
    assert calls == []


def test_empty_images_fail_at_once_without_a_request():
    calls = []
    with running_server(lambda *args: calls.append(1) or [0.0]) as (_, url):
        manager = RewardManager([RewardSpec("http_scorer", kwargs={"url": url, **FAST})])
        with pytest.raises(RewardError, match=r"reward 'http_scorer' raised ProtocolError: .*shape \(1, 0, 0, 3\), with a dim of size 0"):
            manager.score(torch.zeros(1, 0, 0, 3, dtype=torch.uint8), ["a"])
    assert calls == []


def test_503_twice_then_200_succeeds():
    answers = [503, 503]
    brightness = build_reward("brightness")

    def flaky(tensor, prompts, metadata):
        if answers:
            raise HttpStatusError(answers.pop(0), "model loading")
        return brightness(tensor, prompts, metadata)

    images = _images(2)
    with running_server(flaky) as (_, url):
        assert build_reward("http_scorer", url=url, **FAST)(images, ["a", "b"], [{}, {}]) == brightness(images, ["a", "b"], [{}, {}])
    assert answers == []


def test_400_fails_at_once():
    # a latent-only server answers an image batch with 400: resending cannot help
    with running_server(latent_stats()) as (_, url):
        with pytest.raises(RewardServerError, match=r"HTTP 400: this server's scorer takes 'latents'.*after 1 attempt") as info:
            build_reward("http_scorer", url=url, retries=5, backoff_s=0.01)(_images(1), ["a"], [{}])
    assert info.value.attempts == 1


def test_server_killed_mid_run_fails_the_step_then_recovers_on_the_same_port():
    images, prompts = _images(2), ["a", "b"]
    server, url = serve_in_thread(build_reward("saturation"))
    port = server.server_address[1]
    try:
        manager = RewardManager([RewardSpec("http_scorer", kwargs={"url": url, "retries": 1, "backoff_s": 0.01})])
        first = manager.score(images, prompts)
    finally:
        server.stop()
    with pytest.raises(RewardError, match=rf"reward 'http_scorer' raised RewardServerError: reward server {url}/score failed after 2 attempt"):
        manager.score(images, prompts)
    with running_server(build_reward("saturation"), port=port):
        assert torch.equal(manager.score(images, prompts).total, first.total)


def test_non_finite_scores_from_the_scorer_never_become_rewards():
    with running_server(lambda tensor, prompts, metadata: [float("nan")] * len(prompts)) as (_, url):
        manager = RewardManager([RewardSpec("http_scorer", kwargs={"url": url, "retries": 0})])
        with pytest.raises(RewardError, match="HTTP 500: .*non-finite score nan at sample index 0"):
            manager.score(_images(1), ["a"])


def test_a_bad_url_scheme_fails_when_the_options_are_checked():
    from omni_rl.reward import RewardConfigError
    from omni_rl.reward.registry import check_reward_options

    with pytest.raises(RewardConfigError, match="reward 'http_scorer': url='ftp://x' has the scheme 'ftp'; accepted schemes: http, https"):
        check_reward_options("http_scorer", {"url": "ftp://x"})

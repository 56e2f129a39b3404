"""Micro-batched, asynchronous scoring gives the same rewards as scoring the batch at once."""
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from omni_rl.reward import register_reward
from omni_rl.reward.async_scorer import AsyncRewardScorer
from omni_rl.reward.manager import RewardError, RewardManager, RewardSpec


def images(n):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 16, 16, 3), generator=g, dtype=torch.uint8)


def test_micro_batches_match_the_whole_batch():
    manager = RewardManager([RewardSpec("brightness", 1.0), RewardSpec("jpeg_compressibility", 0.5)])
    imgs = images(10)
    prompts, meta = [f"p{i}" for i in range(10)], [{} for _ in range(10)]
    whole = manager.score(imgs, prompts, meta)
    scorer = AsyncRewardScorer(manager, max_batch_size=4, max_wait_ms=50)
    try:
        # Samples arrive from several threads, as a rollout engine finishes them.
        with ThreadPoolExecutor(3) as pool:
            futures = list(pool.map(lambda i: scorer.submit(imgs[i], prompts[i], meta[i]), range(10)))
        out = scorer.gather(futures, timeout_s=30)
    finally:
        scorer.close()
    torch.testing.assert_close(out.total, whole.total)
    for name in whole.per_reward:
        torch.testing.assert_close(out.per_reward[name], whole.per_reward[name])
    assert out.metrics["reward/total/mean"] == pytest.approx(whole.metrics["reward/total/mean"], abs=1e-6)
    # 10 samples in micro-batches of at most 4: at least 3 reward calls.
    assert scorer.batches_scored >= 3


def test_a_required_failure_reaches_gather():
    name = f"tests.async.broken_{uuid.uuid4().hex[:8]}"

    @register_reward(name)
    def broken():
        def score(samples, prompts, metadata):
            raise RuntimeError("judge down")

        return score

    scorer = AsyncRewardScorer(RewardManager([RewardSpec(name)]), max_batch_size=2, max_wait_ms=1)
    try:
        futures = [scorer.submit(img, "p", {}) for img in images(3)]
        with pytest.raises(RewardError, match=name):
            scorer.gather(futures, timeout_s=30)
    finally:
        scorer.close()


def test_an_optional_failure_is_a_fraction_of_samples():
    name = f"tests.async.flaky_{uuid.uuid4().hex[:8]}"
    calls = []

    @register_reward(name)
    def flaky():
        def score(samples, prompts, metadata):
            calls.append(len(prompts))
            if len(calls) == 1:
                raise RuntimeError("first micro-batch fails")
            return [1.0] * len(prompts)

        return score

    manager = RewardManager([RewardSpec("brightness"), RewardSpec(name, required=False)])
    scorer = AsyncRewardScorer(manager, max_batch_size=2, max_wait_ms=200)
    try:
        futures = [scorer.submit(img, "p", {}) for img in images(4)]
        out = scorer.gather(futures, timeout_s=30)
    finally:
        scorer.close()
    assert out.metrics[f"reward/{name}/failed"] == pytest.approx(0.5)
    assert name in out.failed


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="max_batch_size"):
        AsyncRewardScorer(RewardManager([RewardSpec("brightness")]), max_batch_size=0)


def test_a_timeout_names_the_reward_that_is_still_running():
    name = f"tests.async.hangs_{uuid.uuid4().hex[:8]}"
    release = threading.Event()

    @register_reward(name)
    def hangs():
        def score(samples, prompts, metadata):
            release.wait(30)
            return [1.0] * len(prompts)

        return score

    scorer = AsyncRewardScorer(RewardManager([RewardSpec("brightness"), RewardSpec(name)]), max_batch_size=2, max_wait_ms=1)
    try:
        futures = [scorer.submit(img, "p", {}) for img in images(2)]
        with pytest.raises(RewardError) as info:
            scorer.gather(futures, timeout_s=0.5)
    finally:
        release.set()
        scorer.close()
    message = str(info.value)
    assert "scoring sample 0 took longer than 0.5 s (reward.timeout_s)" in message
    assert f"still running: reward '{name}' for " in message and "'brightness'" not in message


def test_a_timeout_of_a_queued_batch_names_the_configured_rewards():
    # No reward runs while a sample is still queued: the message lists every configured reward.
    scorer = AsyncRewardScorer(RewardManager([RewardSpec("brightness"), RewardSpec("contrast")]), max_batch_size=2)
    scorer.close()  # no worker thread left to score it
    from concurrent.futures import Future

    with pytest.raises(RewardError, match=r"took longer than 0.1 s \(reward.timeout_s\); waiting for reward\(s\) "
                                          r"'brightness', 'contrast'"):
        scorer.gather([Future()], timeout_s=0.1)

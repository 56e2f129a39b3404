"""RewardScores: a scorer's per-sample groups become `reward/<group>` means, in one call and across micro-batches."""
import uuid

import pytest
import torch

from omni_rl.reward import RewardScores, register_reward
from omni_rl.reward.async_scorer import AsyncRewardScorer
from omni_rl.reward.manager import RewardError, RewardManager, RewardSpec

IMAGES = torch.zeros(4, 8, 8, 3, dtype=torch.uint8)
PROMPTS = ["a", "b", "c", "d"]


def grouped_reward(groups, scores=(1.0, 0.0, 1.0, 0.5)):
    """A reward returning `scores` (by prompt) with `groups` (by prompt), registered under a fresh name."""
    name = f"tests.scores.grouped_{uuid.uuid4().hex[:8]}"

    @register_reward(name)
    def factory():
        def score(samples, prompts, metadata):
            by_prompt = isinstance(groups, list) and len(groups) == len(PROMPTS)
            return RewardScores([dict(zip(PROMPTS, scores))[p] for p in prompts],
                                [dict(zip(PROMPTS, groups))[p] for p in prompts] if by_prompt else groups)

        return score

    return name


def test_groups_are_reported_as_their_mean_scores():
    name = grouped_reward(["bench/counting", "bench/counting", "bench/position", None])
    out = RewardManager([RewardSpec(name, weight=2.0), RewardSpec("brightness", weight=0.0)]).score(IMAGES, PROMPTS)
    # counting: (1 + 0) / 2; position: 1; the sample in no group counts only in the reward's mean.
    assert out.metrics["reward/bench/counting"] == 0.5 and out.metrics["reward/bench/position"] == 1.0
    assert out.metrics[f"reward/{name}/mean"] == pytest.approx(2.5 / 4)
    torch.testing.assert_close(out.total, torch.tensor([2.0, 0.0, 2.0, 1.0]))
    assert out.groups == {name: ["bench/counting", "bench/counting", "bench/position", None]}
    assert not any(k.startswith("reward/bench") for k in RewardManager([RewardSpec("brightness")]).score(IMAGES, PROMPTS).metrics)


@pytest.mark.parametrize("groups, message", [
    (["bench/a"] * 3, "a list of 4 group keys"),
    ("bench/a", "a list of 4 group keys"),
    (["bench/a", "bench", None, None], "'bench' of sample 1 is not a metric path"),
    (["total/x", None, None, None], "would shadow the metrics reward/total/"),
    (["brightness/x", None, None, None], "would shadow the metrics reward/brightness/"),
])
def test_bad_groups_fail_like_a_bad_score_list(groups, message):
    name = grouped_reward(groups)
    with pytest.raises(RewardError, match=message) as info:
        RewardManager([RewardSpec(name), RewardSpec("brightness")]).score(IMAGES, PROMPTS)
    assert name in str(info.value)


def test_micro_batches_give_the_whole_steps_group_means():
    name = grouped_reward(["bench/counting", "bench/counting", "bench/position", None])
    manager = RewardManager([RewardSpec(name)])
    whole = manager.score(IMAGES, PROMPTS)
    scorer = AsyncRewardScorer(manager, max_batch_size=1, max_wait_ms=0)  # one sample per call
    try:
        out = scorer.gather([scorer.submit(IMAGES[i], PROMPTS[i], {}) for i in range(4)], timeout_s=30)
    finally:
        scorer.close()
    assert scorer.batches_scored == 4
    assert {k: v for k, v in out.metrics.items() if "bench" in k} == {"reward/bench/counting": 0.5, "reward/bench/position": 1.0}
    assert out.groups == whole.groups


def detailed_reward(details):
    """A reward returning groups and `details` (one dict per sample, by prompt order)."""
    name = f"tests.scores.detailed_{uuid.uuid4().hex[:8]}"
    groups = ["bench/counting", "bench/counting", "bench/position", None]

    @register_reward(name)
    def factory():
        def score(samples, prompts, metadata):
            index = [PROMPTS.index(p) for p in prompts]
            return RewardScores([1.0] * len(prompts), [groups[i] for i in index],
                                details if not isinstance(details, list) else [details[i] for i in index])

        return score

    return name


DETAILS = [{"strict": True, "reason": ""}, {"strict": False, "reason": "2 of 3"}, {"strict": 0, "reason": "x"},
           {"strict": 1, "reason": ""}]


def test_details_reach_the_output_and_their_numbers_are_logged_per_group_in_one_call_and_over_micro_batches():
    name = detailed_reward(DETAILS)
    manager = RewardManager([RewardSpec(name)])
    out = manager.score(IMAGES, PROMPTS)
    assert out.details == {name: DETAILS}
    # counting: strict (True + False) / 2 = 0.5; position: 0; the ungrouped sample in none; the
    # string field is no metric.
    assert out.metrics["reward/bench/counting/strict"] == 0.5 and out.metrics["reward/bench/position/strict"] == 0.0
    assert not any("reason" in k for k in out.metrics)
    scorer = AsyncRewardScorer(manager, max_batch_size=1, max_wait_ms=0)
    try:
        step = scorer.gather([scorer.submit(IMAGES[i], PROMPTS[i], {}) for i in range(4)], timeout_s=30)
    finally:
        scorer.close()
    assert step.details == out.details
    assert {k: v for k, v in step.metrics.items() if k.endswith("/strict")} == \
        {"reward/bench/counting/strict": 0.5, "reward/bench/position/strict": 0.0}


@pytest.mark.parametrize("details, message", [
    (({},) * 3, "a list of 4 dicts"), ("x", "a list of 4 dicts"), ([{"a b": 1}] * 4, "metric-name keys"),
])
def test_bad_details_fail_the_reward(details, message):
    with pytest.raises(RewardError, match=message):
        RewardManager([RewardSpec(detailed_reward(details))]).score(IMAGES, PROMPTS)

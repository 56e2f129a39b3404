"""Text batches (generated strings) through the input checks and the manager (omni_rl/reward)."""
import numpy as np
import pytest
import torch

from omni_rl.reward import RewardError, RewardInputError, RewardManager, RewardSpec, register_reward
from omni_rl.reward.inputs import (
    IMAGES,
    TEXTS,
    batch_size,
    check_batch,
    ground_truths,
    sample_kind,
    to_pil_list,
    to_text_list,
    to_uint8_numpy,
)


@register_reward("tests.text.length")
def length():
    """len(text): a text scorer that checks it is handed strings."""
    def score(samples, prompts, metadata):
        return [float(len(t)) for t in to_text_list(samples)]
    return score


@register_reward("tests.text.echo_prompt")
def echo_prompt():
    return lambda samples, prompts, metadata: [float(p == s) for s, p in zip(samples, prompts)]


@register_reward("tests.text.brightness_like")
def brightness_like():
    """An image scorer (converts to pixels first), to check the text refusal."""
    return lambda samples, prompts, metadata: to_uint8_numpy(samples).mean(axis=(1, 2, 3)).tolist()


TEXTS_BATCH = ["abc", "", "hello"]
PROMPTS = ["p0", "p1", "p2"]
META = [{}, {}, {}]


def test_kind_and_batch_size_of_texts():
    assert sample_kind(TEXTS_BATCH) == TEXTS and sample_kind(tuple(TEXTS_BATCH)) == TEXTS
    assert sample_kind(torch.zeros(1, 2, 2, 3, dtype=torch.uint8)) == IMAGES
    assert batch_size(TEXTS_BATCH) == 3
    assert check_batch(TEXTS_BATCH, PROMPTS, META) == 3
    assert check_batch(("x",), ["p"], [{}]) == 1
    assert to_text_list(tuple(TEXTS_BATCH)) == TEXTS_BATCH


def test_text_batch_errors_say_texts():
    with pytest.raises(RewardInputError, match="got 3 texts but 2 prompts"):
        check_batch(TEXTS_BATCH, PROMPTS[:2], META)
    with pytest.raises(RewardInputError, match="got 3 texts but 1 metadata"):
        check_batch(TEXTS_BATCH, PROMPTS, [{}])
    with pytest.raises(RewardInputError, match=r"single string .*Wrap it: \[text\]"):
        check_batch("abc", ["p"], [{}])
    with pytest.raises(RewardInputError, match=r"samples\[1\] has type int .*not a mix"):
        check_batch(["a", 3], ["p", "q"], [{}, {}])
    with pytest.raises(RewardInputError, match="empty batch"):
        check_batch([], [], [])


def test_image_converters_refuse_texts_clearly():
    for convert in (to_uint8_numpy, to_pil_list):
        with pytest.raises(RewardInputError, match="this reward scores images, but the samples are text"):
            convert(TEXTS_BATCH)


def test_text_list_refuses_images():
    with pytest.raises(RewardInputError, match=r"this reward scores text, but the samples are images \(a Tensor of 2\)"):
        to_text_list(torch.zeros(2, 2, 2, 3, dtype=torch.uint8))
    with pytest.raises(RewardInputError, match=r"samples are images \(a list of ndarray of 1\)"):
        to_text_list([np.zeros((2, 2, 3), np.uint8)])


def test_ground_truths_names_the_missing_index():
    assert ground_truths([{"ground_truth": "1"}, {"ground_truth": 0}], "r") == ["1", 0]
    with pytest.raises(RewardInputError, match=r"reward 'r': metadata\[1\] has no 'ground_truth' \(its keys: \['x'\]\)"):
        ground_truths([{"ground_truth": "1"}, {"x": 1}], "r")
    with pytest.raises(RewardInputError, match=r"metadata\[0\] has no 'ground_truth'"):
        ground_truths([{"ground_truth": None}], "r")


def test_manager_scores_texts_positionally_and_by_keyword():
    manager = RewardManager([RewardSpec("tests.text.length", weight=2.0), RewardSpec("tests.text.echo_prompt")])
    # total = 2 * len + [sample == prompt] = [6 + 0, 0 + 1, 10 + 0]
    out = manager.score(["abc", "p1", "hello"], PROMPTS, META)
    torch.testing.assert_close(out.total, torch.tensor([6.0, 5.0, 10.0]))
    torch.testing.assert_close(out.per_reward["tests.text.echo_prompt"], torch.tensor([0.0, 1.0, 0.0]))
    same = manager.score(samples=["abc", "p1", "hello"], prompts=PROMPTS, metadata=None)
    torch.testing.assert_close(same.total, out.total)
    assert out.metrics["reward/tests.text.length/mean"] == pytest.approx(10 / 3)


def test_manager_text_input_errors_before_any_reward():
    manager = RewardManager([RewardSpec("tests.text.length")])
    with pytest.raises(RewardInputError, match="3 texts but 2 prompts"):
        manager.score(TEXTS_BATCH, PROMPTS[:2], META)


def test_image_reward_on_texts_fails_naming_the_reward():
    manager = RewardManager([RewardSpec("tests.text.brightness_like")])
    with pytest.raises(RewardError, match="'tests.text.brightness_like' raised RewardInputError: this reward scores images"):
        manager.score(TEXTS_BATCH, PROMPTS, META)
    # Optional: left out of the total with the failed flag, the text reward carries on.
    manager = RewardManager([RewardSpec("tests.text.length"), RewardSpec("tests.text.brightness_like", required=False)])
    out = manager.score(TEXTS_BATCH, PROMPTS, META)
    assert out.failed == ["tests.text.brightness_like"]
    assert out.metrics["reward/tests.text.brightness_like/failed"] == 1.0


@register_reward("tests.text.wrong_count")
def wrong_count():
    return lambda samples, prompts, metadata: [1.0]


def test_wrong_number_of_scores_names_texts():
    manager = RewardManager([RewardSpec("tests.text.wrong_count")])
    with pytest.raises(RewardError, match=r"returned scores of shape \(1,\) for 3 texts"):
        manager.score(TEXTS_BATCH, PROMPTS, META)


def test_real_text_rewards_through_the_manager():
    manager = RewardManager([
        {"name": "math_answer", "weight": 0.9},
        {"name": "format", "weight": 0.1, "kwargs": {"pattern": "think_boxed"}},
    ])
    responses = [
        "<think>2 + 2 is 4</think> The answer is \\boxed{4}.",  # right and well formed: 1.0
        "\\boxed{4}",                                           # right, no think: 0.9
        "<think>guess</think> \\boxed{5}",                      # wrong, well formed: 0.1
    ]
    out = manager.score(responses, ["2+2?"] * 3, [{"ground_truth": "4"}] * 3)
    torch.testing.assert_close(out.total, torch.tensor([1.0, 0.9, 0.1]))
    with pytest.raises(RewardError, match=r"reward 'math_answer' raised RewardInputError: .*metadata\[2\] has no 'ground_truth'"):
        manager.score(responses, ["2+2?"] * 3, [{"ground_truth": "4"}, {"ground_truth": "4"}, {}])

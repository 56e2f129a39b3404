"""rewards/format.py: the boxed, think_answer and think_boxed structures."""
import time

import pytest

from omni_rl.reward import build_reward


def _score(pattern, *responses):
    return build_reward("format", pattern=pattern)(list(responses), ["q"] * len(responses), [{}] * len(responses))


@pytest.mark.parametrize(
    "response, expected",
    [
        (r"so \boxed{3}.", 1.0),
        (r"\boxed{\frac{1}{2}}", 1.0),
        (r"\fbox{x}", 1.0),
        (r"\boxed{1} and \boxed{2}", 0.0),   # more than one
        (r"\boxed{}", 0.0),                   # empty
        (r"\boxed{ 3", 0.0),                  # never closed
        ("3", 0.0),
        ("", 0.0),
    ],
)
def test_boxed(response, expected):
    assert _score("boxed", response) == [expected]


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>2+2=4</think><answer>4</answer>", 1.0),
        ("  <think>\nreason\n</think>\n\n<answer> 4 </answer>\n", 1.0),
        ("<think>r</think>text<answer>4</answer>", 0.0),        # text between the blocks
        ("hi <think>r</think><answer>4</answer>", 0.0),         # text before
        ("<think>r</think><answer>4</answer> bye", 0.0),        # text after
        ("<answer>4</answer><think>r</think>", 0.0),            # wrong order
        ("<think> </think><answer>4</answer>", 0.0),            # blank thinking
        ("<think>r</think><answer> </answer>", 0.0),            # blank answer
        ("<think>r<think>s</think><answer>4</answer>", 0.0),    # nested tag
        ("<think>r</think><answer>4</answer><answer>5</answer>", 0.0),
        ("<think>r</think>", 0.0),
        ("<think>r</think><answer>4", 0.0),
        ("", 0.0),
    ],
)
def test_think_answer(response, expected):
    assert _score("think_answer", response) == [expected]


@pytest.mark.parametrize(
    "response, expected",
    [
        (r"<think>2+2</think> The answer is \boxed{4}.", 1.0),
        (r"<think>2+2</think>\boxed{4}", 1.0),
        (r"\boxed{4}", 0.0),                                    # no thinking
        (r"<think>\boxed{4}</think> done", 0.0),                # the box must come after
        (r"<think>r</think> \boxed{4} \boxed{5}", 0.0),
        (r"x <think>r</think> \boxed{4}", 0.0),
        (r"<think></think> \boxed{4}", 0.0),
    ],
)
def test_think_boxed(response, expected):
    assert _score("think_boxed", response) == [expected]


def test_batch_and_bad_pattern():
    assert _score("boxed", r"\boxed{1}", "no", "") == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"pattern='xml'; expected one of \['boxed', 'think_answer', 'think_boxed'\]"):
        build_reward("format", pattern="xml")


def test_degenerate_responses_stay_fast():
    # A collapsed policy repeats itself; the checks must stay linear in the response length.
    start = time.perf_counter()
    for junk in ("\\boxed{" * 20000, "<answer>" * 20000, "<think>" + "{" * 100000, "\\boxed " * 20000):
        for pattern in ("boxed", "think_answer", "think_boxed"):
            _score(pattern, junk)
        build_reward("math_answer")([junk], ["q"], [{"ground_truth": "1"}])
        build_reward("multiple_choice")([junk], ["q"], [{"ground_truth": "A"}])
    assert time.perf_counter() - start < 5.0

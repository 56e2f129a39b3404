"""rewards/math_answer.py: answer extraction, normalisation and exact equivalence, by hand cases."""
from fractions import Fraction

import pytest
import torch

from omni_rl.reward import RewardInputError, build_reward
from rewards.answer_extraction import extract_answer_tag, extract_boxed
from rewards.math_answer import answers_equal, evaluate_rational, extract_final_answer, normalize_answer


def _score(responses, truths, **kwargs):
    return build_reward("math_answer", **kwargs)(responses, ["q"] * len(responses), [{"ground_truth": t} for t in truths])


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{3}", "3"),
        (r"\boxed{1} no wait \boxed{2}", "2"),                        # the last one
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),                     # nested braces
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),                           # escaped braces are literal
        (r"\boxed {7}", "7"),                                          # a space before the brace
        (r"\boxed 5$.", "5"),                                           # no braces: the next token
        (r"\fbox{8}", "8"),
        (r"\boxed{1} and then \boxed{2", None),                       # last box never closed
        ("no box here", None),
        (r"\boxed{\boxed{9}}", "9"),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_answer_tag_and_precedence():
    assert extract_answer_tag("<answer> 1 </answer> then <ANSWER>2</ANSWER>") == "2"
    assert extract_answer_tag("<answer>unclosed") is None
    # A box wins over the tag, whatever their order.
    assert extract_final_answer(r"<answer>3</answer> \boxed{4}") == "4"
    assert extract_final_answer(r"\boxed{4} <answer>3</answer>") == "4"
    assert extract_final_answer("<think>x</think><answer>12</answer>") == "12"
    # A truncated box means no answer, even with a tag present.
    assert extract_final_answer(r"<answer>3</answer> \boxed{4") is None
    assert extract_final_answer(r"\boxed{ }") is None
    assert extract_final_answer("The answer is 4.") is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("$3$", "3"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"\dfrac34", r"\frac{3}{4}"),
        (r"\tfrac{1}{2}", r"\frac{1}{2}"),
        (r"\frac 3 4", r"\frac{3}{4}"),
        (r"3\!", "3"),
        (r"1\,000", "1000"),
        ("1{,}000", "1000"),
        (r"5\text{ cm}", "5"),
        (r"5 \text{cm}^2", "5"),
        (r"\text{Area} = 12\text{ m}^{2}.", "12"),
        (r"\text{yes}", "yes"),
        (r"2 \text{ or } 3", "2or3"),
        (r"90^\circ", "90"),
        (r"90^{\circ}", "90"),
        (r"50\%", "50%"),
        (r"\displaystyle \sqrt2", r"\sqrt{2}"),
        ("\u22123", "-3"),
        (r"\(x\)", "x"),
    ],
)
def test_normalize(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(
    "text, value",
    [
        ("42", 42),
        ("-7", -7),
        ("+3", 3),
        ("3.25", Fraction(13, 4)),
        (".5", Fraction(1, 2)),
        ("3.", 3),
        ("1e3", 1000),
        ("2.5e-1", Fraction(1, 4)),
        ("1,000", 1000),
        ("-1,234,567.5", Fraction(-2469135, 2)),
        ("3/4", Fraction(3, 4)),
        (r"\frac{3}{4}", Fraction(3, 4)),
        (r"-\frac{3}{4}", Fraction(-3, 4)),
        (r"\frac{-3}{4}", Fraction(-3, 4)),
        (r"\frac{1.5}{3}", Fraction(1, 2)),
        (r"\frac{\frac{1}{2}}{2}", Fraction(1, 4)),
        ("1/2+1/4", Fraction(3, 4)),
        ("2^{10}", 1024),
        ("10^{-3}", Fraction(1, 1000)),
        (r"1.5\times10^{3}", 1500),
        (r"3\cdot4", 12),
        (r"6\div4", Fraction(3, 2)),
        ("(((2)))", 2),
        ("2*(3-1)", 4),
        ("--2", 2),
    ],
)
def test_evaluate_rational(text, value):
    assert evaluate_rational(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "", "x", r"\pi", r"\sqrt{2}", "2^{1/2}", "1/0", r"\frac{1}{0}", "0^{-1}", "2(3)", r"2\frac{1}{2}",
        "1,00", "1+", "(1", "10^{100000}", "((2^{100})^{100})^{100}", "(" * 3000 + "1" + ")" * 3000, "1" * 600,
    ],
)
def test_evaluate_rational_refuses(text):
    assert evaluate_rational(text) is None


@pytest.mark.parametrize(
    "answer, reference",
    [
        ("3/4", "0.75"),
        (r"\frac{3}{4}", "3/4"),
        (r"\dfrac34", "0.75"),
        (r"\tfrac{6}{8}", r"\frac{3}{4}"),
        ("0.750", "3/4"),
        ("1,000", "1000"),
        ("1{,}000", "1000.0"),
        (r"1\,000", "1000"),
        ("-5", "-5.0"),
        (r"-\frac{1}{2}", "-0.5"),
        (r"\frac{-1}{2}", "-1/2"),
        (r"\left( -\dfrac{1}{2} \right)", "-0.5"),
        ("$3$", "3"),
        (r"3\!", "3"),
        (r"5\text{ cm}", "5"),
        (r"5 \text{cm}^2", "5"),
        (r"90^\circ", "90"),
        ("50%", "0.5"),
        (r"50\%", "50"),
        ("12.5%", "1/8"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"(\frac{1}{2}, -3)", "(0.5,-3)"),
        ("[1, 2)", r"\left[1,2\right)"),
        ("1, 2, 3", "1,2,3"),
        ("x = 3", "3"),
        ("3", "x=3"),
        (r"\theta = \frac{1}{2}", "0.5"),
        ("x_1 = 2", "2"),
        (r"(x, y) = (1, 2)", "(x,y)=(1,2)"),
        (r"\sqrt{2}", r"\sqrt2"),
        (r"2\sqrt{3}", r"2 \sqrt 3"),
        (r"\pi", r"\pi"),
        (r"\text{yes}", "yes"),
        ("1e3", "1000"),
        (r"1.5 \times 10^{3}", "1500"),
        ("2^{10}", "1024"),
        ("1/2 + 1/4", "3/4"),
        ("4.", "4"),
    ],
)
def test_equal(answer, reference):
    assert answers_equal(answer, reference)
    assert answers_equal(reference, answer)  # symmetric


@pytest.mark.parametrize(
    "answer, reference",
    [
        ("4", "5"),
        ("0.33", "1/3"),            # exact arithmetic: no tolerance
        ("-3", "3"),
        ("50%", "0.5%"),            # two percentages compare as written
        ("(1,2)", "[1,2]"),         # brackets matter (intervals)
        ("(1,2)", "1,2"),
        ("(1,2)", "(2,1)"),         # order matters
        ("(1,2)", "(1,2,3)"),
        ("x=3", "y=3"),
        (r"\sqrt{2}", r"\sqrt{3}"),
        ("X", "x"),                 # case-sensitive
        ("", "0"),
        (r"\frac{1}{0}", "0"),
        ("1,000", "(1,0)"),
        (r"2\frac{1}{2}", "2.5"),   # a mixed number is not evaluated
    ],
)
def test_not_equal(answer, reference):
    assert not answers_equal(answer, reference)
    assert not answers_equal(reference, answer)


def test_percent_option_off():
    assert not answers_equal("50%", "0.5", percent=False)
    assert answers_equal("50%", "50", percent=False)
    assert _score([r"\boxed{50\%}"], ["0.5"], percent=False) == [0.0]
    assert _score([r"\boxed{50\%}"], ["0.5"]) == [1.0]


def test_scores_a_batch():
    responses = [
        r"First, 3 + 4 = 7. So the answer is $\boxed{7}$.",
        r"I think it is \boxed{8}.",
        "<think>half</think><answer>\\frac{1}{2}</answer>",
        "It is 7.",                          # no box, no tag: no answer
        r"\boxed{7} wait, \boxed{-7}",        # the last box counts
        r"\boxed{\dfrac{3}{4}}",
        r"\boxed{1,000}",
        r"\boxed{(1, 2)}",
    ]
    truths = ["7", "7", "0.5", "7", "-7", "3/4", 1000, "(1,2)"]
    assert _score(responses, truths) == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "truth, response, expected",
    [
        (3, r"\boxed{3.0}", 1.0),
        (0.1, r"\boxed{1/10}", 1.0),
        (-2.5, r"\boxed{-\frac52}", 1.0),
        (r"The answer is \boxed{\frac{2}{3}}.", r"\boxed{4/6}", 1.0),   # a boxed reference
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", r"\boxed{72}", 1.0),  # GSM8K style
        (["2", "-2"], r"\boxed{-2}", 1.0),                              # accepted alternatives
        (["2", "-2"], r"\boxed{0}", 0.0),
    ],
)
def test_reference_forms(truth, response, expected):
    assert _score([response], [truth]) == [expected]


@pytest.mark.parametrize("truth", [True, {"a": 1}, [], float("nan"), [1, None]])
def test_bad_reference_names_the_index(truth):
    with pytest.raises(RewardInputError, match=r"metadata\[1\]\['ground_truth'\]"):
        _score([r"\boxed{1}", r"\boxed{1}"], ["1", truth])


def test_missing_reference_names_the_index():
    scorer = build_reward("math_answer")
    with pytest.raises(RewardInputError, match=r"metadata\[1\] has no 'ground_truth'"):
        scorer([r"\boxed{1}", r"\boxed{1}"], ["q", "q"], [{"ground_truth": "1"}, {}])


def test_refuses_images():
    with pytest.raises(RewardInputError, match="this reward scores text, but the samples are images"):
        build_reward("math_answer")(torch.zeros(1, 2, 2, 3, dtype=torch.uint8), ["q"], [{"ground_truth": "1"}])


def test_bad_options():
    with pytest.raises(ValueError, match="percent='yes'"):
        build_reward("math_answer", percent="yes")


def test_symbolic_needs_math_verify():
    try:
        import math_verify  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install 'math-verify"):
            build_reward("math_answer", symbolic=True)
    else:
        scorer = build_reward("math_answer", symbolic=True)
        assert scorer([r"\boxed{(x+1)^2}"], ["q"], [{"ground_truth": "x^2+2x+1"}]) == [1.0]


def test_check_item_wants_a_usable_reference_answer():
    from rewards.math_answer import check_math_item

    assert check_math_item("1+1?", {"ground_truth": "2"}) is None
    assert check_math_item("1+1?", {"ground_truth": [2, "2.0"]}) is None
    assert check_math_item("1+1?", {"reward_model": {"style": "rule"}}).startswith(
        "has no reference answer: its metadata has no 'ground_truth' (keys: ['reward_model'])")
    assert check_math_item("1+1?", {"ground_truth": []}).startswith("has an unusable reference answer: metadata['ground_truth'] is an empty list")
    assert "is True (bool)" in check_math_item("1+1?", {"ground_truth": True})

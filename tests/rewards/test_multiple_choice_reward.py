"""rewards/multiple_choice.py: which letter a response picks, and the rule precedence."""
import pytest

from omni_rl.reward import RewardInputError, build_reward


def _chosen(response, choices="ABCDE"):
    return build_reward("multiple_choice", choices=choices).chosen_letter(response)


@pytest.mark.parametrize(
    "response, letter",
    [
        # 1. the last \boxed{}
        (r"\boxed{B}", "B"),
        (r"\boxed{(b)}", "B"),
        (r"\boxed{\text{C}}", "C"),
        (r"\boxed{B. 42}", "B"),
        (r"\boxed{D) 7 apples}", "D"),
        (r"$\boxed{A}$", "A"),
        (r"\boxed{A} no, \boxed{E}", "E"),
        (r"the answer is B, so \boxed{42}", None),        # a box decides alone, even without a letter
        (r"\boxed{Because}", None),
        (r"Answer: A \boxed{C", None),                     # an unclosed box: no answer
        # 2. the last <answer> tag
        ("<answer>D</answer>", "D"),
        ("<think>A or B?</think><answer> (e) </answer>", "E"),
        ("<answer>C</answer> but the answer is A", "C"),
        ("<answer>42</answer> the answer is A", None),
        # 3. the last answer phrase
        ("Answer: (B)", "B"),
        ("Answer: B", "B"),
        ("the answer is C.", "C"),
        ("**Answer:** D", "D"),
        ("The correct answer is option E", "E"),
        ("the answer is (a)", "A"),
        ("I first thought the answer is A, but the answer is B", "B"),
        ("the answer is a prime number", None),             # a lower-case 'a' outside brackets is a word
        ("Answer: F", None),                                # not a choice
        ("the answer is Bob", None),
        # 4. the whole response is a letter
        ("B", "B"),
        ("  (C).  ", "C"),
        ("d", "D"),
        # nothing
        ("", None),
        ("Because it rains", None),
        ("I like A and B", None),
    ],
)
def test_chosen_letter(response, letter):
    assert _chosen(response) == letter


def test_custom_choices():
    assert _chosen("Answer: E", choices="ABCD") is None
    assert _chosen(r"\boxed{F}", choices="abcdef") == "F"
    assert _chosen("the answer is (h)", choices="EFGH") == "H"


def test_scores_case_insensitively():
    scorer = build_reward("multiple_choice")
    responses = [r"\boxed{b}", "Answer: (B)", "the answer is C", "no idea"]
    metadata = [{"ground_truth": "B"}, {"ground_truth": "b"}, {"ground_truth": "(B)"}, {"ground_truth": "B"}]
    assert scorer(responses, ["q"] * 4, metadata) == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("truth", ["F", "AB", 1, "", "the answer is B"])
def test_bad_reference_names_the_index(truth):
    scorer = build_reward("multiple_choice")
    with pytest.raises(RewardInputError, match=r"metadata\[1\]\['ground_truth'\] is .*one option letter from 'ABCDE'"):
        scorer(["A", "A"], ["q", "q"], [{"ground_truth": "A"}, {"ground_truth": truth}])


def test_missing_reference_names_the_index():
    with pytest.raises(RewardInputError, match=r"metadata\[0\] has no 'ground_truth'"):
        build_reward("multiple_choice")(["A"], ["q"], [{}])


@pytest.mark.parametrize("choices", ["", "AAB", "A1", "AaB", 5])
def test_bad_choices(choices):
    with pytest.raises(ValueError, match="distinct letters"):
        build_reward("multiple_choice", choices=choices)

"""rewards/text_rules.py: response_length and char_match, worked by hand."""
import pytest

from omni_rl.reward import RewardConfigError, build_reward


def _score(name, responses, **kwargs):
    return build_reward(name, **kwargs)(responses, ["q"] * len(responses), [{}] * len(responses))


def test_response_length():
    # target 4: -|len - 4| / 4 for lengths 4, 0, 2, 6, 12
    assert _score("response_length", ["abcd", "", "ab", "abcdef", "x" * 12], target=4) == [0.0, -1.0, -0.5, -0.5, -2.0]
    # characters, not bytes: "é" and the emoji count once each
    assert _score("response_length", ["é😀"], target=2) == [0.0]


def test_response_length_options():
    with pytest.raises(RewardConfigError, match="target"):
        build_reward("response_length")  # no natural default: the option is required
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match=r"target=.*expected an int >= 1"):
            build_reward("response_length", target=bad)


def test_char_match():
    # "aab": 2/3; "": 0 by definition; "bbb": 0; "aaaa": 1; "A": 0 (case-sensitive)
    assert _score("char_match", ["aab", "", "bbb", "aaaa", "A"]) == pytest.approx([2 / 3, 0.0, 0.0, 1.0, 0.0])
    assert _score("char_match", ["x y ", "  "], chars=" ") == [0.5, 1.0]
    # a set of characters: vowels in "banana" are a, a, a -> 3/6; repeats in chars do not count twice
    assert _score("char_match", ["banana", "xyz"], chars="aeiouaa") == [0.5, 0.0]


def test_char_match_options():
    for bad in ("", 1, None):
        with pytest.raises(ValueError, match="expected a non-empty string"):
            build_reward("char_match", chars=bad)

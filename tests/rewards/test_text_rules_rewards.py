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


def test_text_key_scores_the_text_a_sample_carries_whatever_the_sample_is():
    """A talker's speech carries the answer it spoke in metadata["spoken_text"]: scored, not the audio."""
    import torch

    from omni_rl.reward.media import MediaSamples
    from omni_rl.reward.registry import MODALITIES, reward_metadata_needs, reward_modalities

    speech = MediaSamples(audio=[torch.zeros(8), torch.zeros(8)], sample_rate=24000)
    metadata = [{"spoken_text": "aab"}, {"spoken_text": "bbbbbb"}]
    scorer = build_reward("char_match", chars="a", text_key="spoken_text")
    assert scorer(speech, ["q", "q"], metadata) == pytest.approx([2 / 3, 0.0])
    length = build_reward("response_length", target=3, text_key="spoken_text")
    assert length(speech, ["q", "q"], metadata) == [0.0, -1.0]
    # With a key any modality scores and the key must be on every sample (checked at load);
    # without one the rule scores text samples as before.
    assert reward_modalities("char_match", {"text_key": "spoken_text"}) == MODALITIES
    assert reward_metadata_needs("char_match", {"text_key": "spoken_text"}) == {"spoken_text"}
    assert reward_metadata_needs("char_match", {}) == set()
    with pytest.raises(ValueError, match=r"metadata\[1\] has no 'spoken_text'"):
        scorer(speech, ["q", "q"], [{"spoken_text": "a"}, {}])
    for bad in ("", 3):
        with pytest.raises(ValueError, match=r"text_key=.*expected the metadata key"):
            build_reward("char_match", text_key=bad)

"""rewards/speech_rate.py: words per second of metadata.spoken_text over the speaking time, 1 inside
[min_wps, max_wps] and the ratio to the nearer end outside; values worked out by hand."""
import math

import pytest
import torch

from omni_rl.reward import MediaSamples, RewardConfigError, RewardInputError, build_reward

RATE = 16000
FIVE = "Hello, world! How are you?"  # 5 words once punctuation goes


def tone(seconds: float, lead: float = 0.0, tail: float = 0.0) -> torch.Tensor:
    """`lead` s of silence, a 250 Hz cosine of amplitude 0.5 for `seconds` s, `tail` s of silence.
    The cosine starts at 0.5 and its last sample, cos(2 pi 250 (n - 1) / 16000) x 0.5 ~ 0.497, is
    above the 0.01 threshold too, so the speaking time is exactly `seconds`."""
    t = torch.arange(int(seconds * RATE)) / RATE
    return torch.cat([torch.zeros(int(lead * RATE)), 0.5 * torch.cos(2 * math.pi * 250 * t), torch.zeros(int(tail * RATE))])


def score(text, clip, **options):
    scorer = build_reward("speech_rate", **options)
    return scorer(MediaSamples(audio=[clip], sample_rate=RATE), ["p"], [{"spoken_text": text}])[0]


@pytest.mark.parametrize("text, expected", [
    (FIVE, 1.0),                                      # 5 words / 2 s = 2.5 wps, inside [2, 3.5]
    ("one two three four", 1.0),                      # 2.0 wps: the range's ends count as inside
    ("one two three four five six seven", 1.0),       # 3.5 wps
    ("one two three four five six seven eight nine ten", 0.7),  # 5 wps > 3.5: 3.5 / 5
    ("slow, slow", 0.5),                              # 1 wps < 2: 1 / 2
    ("", 0.0),                                        # nothing to say: rate 0
])
def test_rates_worked_by_hand(text, expected):
    assert score(text, tone(2.0)) == pytest.approx(expected, abs=1e-12)


def test_leading_and_trailing_silence_do_not_count():
    padded = tone(2.0, lead=0.5, tail=1.5)
    assert score(FIVE, padded) == 1.0                             # 5 / 2 s, as unpadded
    # No trimming: 5 words over 4 s = 1.25 wps, 1.25 / 2 = 0.625.
    assert score(FIVE, padded, trim_below=None) == pytest.approx(0.625, abs=1e-12)
    # A batch zero-padded to one length keeps each clip's own speaking time.
    batch = torch.stack([tone(2.0, tail=2.0), tone(4.0)])
    scorer = build_reward("speech_rate")
    texts = [{"spoken_text": FIVE}, {"spoken_text": FIVE}]
    assert scorer(MediaSamples(audio=batch, sample_rate=RATE), ["p", "p"], texts) == pytest.approx([1.0, 0.625])


def test_silence_with_words_scores_zero():
    assert score(FIVE, torch.zeros(RATE)) == 0.0       # rate infinite
    assert score("", torch.zeros(RATE)) == 0.0         # rate 0


def test_range_unit_and_channels_are_options():
    # 5 words / 2 s = 2.5 wps; range [3, 4]: 2.5 / 3.
    assert score(FIVE, tone(2.0), min_wps=3.0, max_wps=4.0) == pytest.approx(2.5 / 3, abs=1e-12)
    # Characters: 今天天气很好 is 6 characters (the full stop goes) over 2 s = 3 per second;
    # range [4, 5]: 3 / 4.
    assert score("今天天气很好。", tone(2.0), unit="characters", min_wps=4.0, max_wps=5.0) == pytest.approx(0.75)
    # Stereo is mixed down first: both channels equal, same time.
    stereo = tone(2.0).expand(2, -1)
    scorer = build_reward("speech_rate")
    assert scorer(MediaSamples(audio=stereo[None], sample_rate=RATE), ["p"], [{"spoken_text": FIVE}]) == [1.0]
    # text_key names the field; a clip as a tensor takes its rate from metadata.
    custom = build_reward("speech_rate", text_key="answer")
    assert custom(tone(2.0)[None], ["p"], [{"answer": FIVE, "sample_rate": RATE}]) == [1.0]
    with pytest.raises(RewardInputError, match=r"speech_rate: metadata\[0\] has no 'answer'"):
        custom(tone(2.0)[None], ["p"], [{"spoken_text": FIVE, "sample_rate": RATE}])


@pytest.mark.parametrize("options, expected", [
    ({"min_wps": 0}, "min_wps=0; expected a finite number > 0"),
    ({"min_wps": 3.0, "max_wps": 2.0}, "max_wps=2.0; expected a finite number >= min_wps=3.0"),
    ({"unit": "syllables"}, "unit='syllables'; expected one of words, characters"),
    ({"trim_below": 1.5}, "trim_below=1.5; expected a magnitude in [0, 1)"),
    ({"text_key": 3}, "text_key=3; expected the metadata key"),
])
def test_bad_options_are_one_line(options, expected):
    with pytest.raises(RewardConfigError) as info:
        build_reward("speech_rate", **options)
    assert f"reward 'speech_rate': {expected}" in str(info.value)

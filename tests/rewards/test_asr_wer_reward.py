"""rewards/asr_wer.py and rewards/transcripts.py: 1 - WER of a Whisper transcript against the text a
sample was asked to say.

The tiny Whisper (random weights, built from a config and loaded back by path through the same
code as openai/whisper-large-v3) transcribes nonsense, so the error-rate maths is checked on
transcripts given directly, with values worked out by hand, and one end-to-end test checks that
whatever the tiny model hears is what gets scored against `spoken_text`.
"""
import math

import pytest
import torch

from omni_rl.reward import MediaSamples, RewardConfigError, RewardInputError, build_reward
from rewards.asr_wer import default_metric
from rewards.tiny_models import build_tiny_whisper
from rewards.transcripts import edit_distance, error_rate, normalize_text

RATE = 16000


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_whisper")
    build_tiny_whisper(folder, window_s=1)
    return str(folder)


@pytest.fixture(scope="module")
def scorer(whisper_dir):
    return build_reward("asr_wer", model=whisper_dir, max_new_tokens=8)


@pytest.fixture(scope="module")
def clips():
    """A 250 Hz tone (1.5 s: longer than the tiny model's 1 s window), silence, and the fixture
    "speech" whose transcript the tests know: noise standing in for a voice saying KNOWN."""
    t = torch.arange(int(1.5 * RATE)) / RATE
    tone = 0.5 * torch.cos(2 * math.pi * 250 * t)
    voice = 0.3 * torch.randn(RATE, generator=torch.Generator().manual_seed(0))
    return {"tone": tone, "silence": torch.zeros(RATE // 2), "voice": voice}


KNOWN = "The cat sat on the mat."  # 6 words once normalised: the cat sat on the mat


@pytest.mark.parametrize("transcript, expected", [
    ("the cat sat on the mat", 1.0),                      # exact
    ("THE CAT, SAT ON THE MAT!", 1.0),                    # case and punctuation do not count
    ("the cat sat on mat", 5 / 6),                        # 1 deletion / 6 words
    ("the cat sat on the mat today", 5 / 6),              # 1 insertion / 6
    ("a cat sat on the hat", 4 / 6),                      # 2 substitutions / 6
    ("cat sat on the mat the", 4 / 6),                    # delete "the", insert "the": 2 / 6
    ("", 0.0),                                            # 6 deletions: WER 1
    ("the cat sat on the mat and then it ran away fast", 0.0),  # 6 insertions: WER 1
    ("um the cat uh sat on uh the er mat and so on", 0.0),      # 7 insertions: WER 7/6, clamped at 0
])
def test_wer_on_the_known_transcript_worked_by_hand(scorer, transcript, expected):
    assert scorer.scores([KNOWN], [transcript]) == pytest.approx([expected], abs=1e-12)


def test_edit_distance_and_error_rates_by_hand():
    assert edit_distance("kitten", "sitting") == 3            # k->s, e->i, +g
    assert edit_distance([], ["a", "b"]) == 2 and edit_distance(["a"], []) == 1
    assert error_rate("a b c d", "a x c", "words") == 0.5     # 1 substitution + 1 deletion over 4
    # Chinese by characters: the full stop goes, then 很 -> 不 is 1 substitution over 6 characters.
    assert error_rate("今天天气很好。", "今天天气不好", "characters") == pytest.approx(1 / 6)
    assert error_rate("今天天气很好。", "今天天气不好", "words") == 1.0   # one "word" each, different
    assert error_rate("", "", "words") == 0.0 and error_rate("...", "hi", "words") == math.inf


def test_normalisation_is_the_stated_one():
    assert normalize_text("  Hello,\tWORLD!!  It's\u00a0$20 — ok… ") == "hello world it s 20 ok"
    assert normalize_text("ｆｕｌｌ　ｗｉｄｔｈ") == "full width"   # NFKC
    assert normalize_text("नमस्ते") == "नमस्ते"                      # combining vowel signs are kept


def test_an_empty_reference_scores_one_only_for_an_empty_transcript(scorer):
    assert scorer.scores(["!", "", ""], ["", "...", "uh"]) == [1.0, 1.0, 0.0]


def test_cer_is_the_default_for_chinese(whisper_dir):
    assert [default_metric(lang) for lang in ("zh", "ZH", "ja", "yue", "en", None)] == ["cer"] * 4 + ["wer"] * 2
    zh = build_reward("asr_wer", model=whisper_dir, language="zh", max_new_tokens=4)
    assert zh.scores(["今天天气很好"], ["今天天气不好"]) == pytest.approx([5 / 6])
    words = build_reward("asr_wer", model=whisper_dir, language="zh", metric="wer", max_new_tokens=4)
    assert words.scores(["今天天气很好"], ["今天天气不好"]) == [0.0]


def test_whisper_english_normaliser_is_an_option(whisper_dir, scorer):
    reference, heard = "My favourite colour is grey; I have twenty dollars.", "my favorite color is gray i have $20"
    english = build_reward("asr_wer", model=whisper_dir, normalizer="whisper_english", max_new_tokens=4)
    assert english.scores([reference], [heard]) == [1.0]
    # Basic: favourite, colour, grey substituted, "twenty dollars" -> "20" one substitution and
    # one deletion: 5 errors over 9 words.
    assert scorer.scores([reference], [heard]) == pytest.approx([4 / 9])


def test_the_tiny_models_transcript_is_scored_against_spoken_text(scorer, clips):
    audio = [clips["tone"], clips["silence"], clips["voice"]]
    media = MediaSamples(audio=audio, sample_rate=RATE)
    transcripts = scorer.transcribe([(clip, RATE) for clip in media.mono()])
    assert len(transcripts) == 3 and all(isinstance(t, str) for t in transcripts)
    assert scorer.transcribe([(clip, RATE) for clip in media.mono()]) == transcripts  # greedy: no draw
    said = [{"spoken_text": transcripts[0]}, {"spoken_text": KNOWN}, {"spoken_text": transcripts[2] + " extra"}]
    scores = scorer(media, ["p"] * 3, said)
    expected = [max(0.0, 1 - error_rate(m["spoken_text"], t, "words")) for m, t in zip(said, transcripts)]
    assert scores == pytest.approx(expected, abs=1e-12)
    assert scores[0] == 1.0 and all(0.0 <= s <= 1.0 for s in scores)
    # A 48 kHz copy of the tone is resampled to 16 kHz first: it is transcribed the same.
    t48 = torch.arange(int(1.5 * 48000)) / 48000
    tone48 = 0.5 * torch.cos(2 * math.pi * 250 * t48)
    assert scorer([tone48], ["p"], [{"spoken_text": transcripts[0], "sample_rate": 48000}]) == [1.0]


def test_text_key_names_the_reference(whisper_dir, clips):
    custom = build_reward("asr_wer", model=whisper_dir, text_key="answer", max_new_tokens=4)
    transcript = custom.transcribe([(clips["tone"], RATE)])[0]
    assert custom([clips["tone"]], ["p"], [{"answer": transcript, "sample_rate": RATE}]) == [1.0]
    with pytest.raises(RewardInputError, match=r"asr_wer: metadata\[0\] has no 'answer' \(the text the sample"):
        custom([clips["tone"]], ["p"], [{"spoken_text": transcript, "sample_rate": RATE}])


def test_input_errors_name_the_sample(scorer, clips):
    with pytest.raises(RewardInputError, match=r"metadata\[1\]\['spoken_text'\] has type int; expected the text as a str"):
        scorer([clips["tone"], clips["tone"]], ["a", "b"], [{"spoken_text": "hi", "sample_rate": RATE},
                                                             {"spoken_text": 3, "sample_rate": RATE}])
    with pytest.raises(RewardInputError, match=r"audio\[0\] has no sample rate"):
        scorer([clips["tone"]], ["a"], [{"spoken_text": "hi"}])


@pytest.mark.parametrize("options, expected", [
    ({"metric": "per"}, "metric='per'; expected wer, cer, or None"),
    ({"normalizer": "english"}, "normalizer='english'; expected one of basic, whisper_english"),
    ({"text_key": ""}, "text_key=''; expected the metadata key"),
    ({"max_new_tokens": 0}, "max_new_tokens=0; expected an int >= 1"),
    ({"language": 3}, "language=3; expected a Whisper language code"),
])
def test_bad_options_fail_before_any_model_loads(options, expected):
    with pytest.raises(RewardConfigError, match=f"reward 'asr_wer': {expected}".replace("(", r"\(").replace(")", r"\)")):
        build_reward("asr_wer", model="never/loaded", **options)


def test_max_new_tokens_within_the_decoder(whisper_dir):
    with pytest.raises(ValueError, match=r"max_new_tokens=446; expected at most 444"):
        build_reward("asr_wer", model=whisper_dir, max_new_tokens=446)


def test_a_language_whisper_does_not_know_is_one_line_at_load(capsys, tmp_path):
    """Issue 45, L2: `language: klingon` failed at step 1, after the model loaded."""
    from omni_rl.cli import main

    reward = "reward.rewards=[{name: asr_wer, reward_options: {model: tiny:whisper-reward, language: klingon}}]"
    assert main(["recipe=tiny_qwen3_omni_talker_grpo", reward, "trainer.val_every=0",
                 f"trainer.output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and not (tmp_path / "out").exists()
    assert "reward 'asr_wer': language='klingon'; expected a Whisper language code or name (e.g. en, zh, english: " \
           "one of the 100 of transformers' WhisperTokenizer), or null to detect it per clip" in err
    from omni_rl.reward.registry import check_reward_options

    for known in ("en", "English", "<|de|>", "cantonese", None):
        check_reward_options("asr_wer", {"language": known})


def test_transcribing_logs_no_transformers_warning_after_the_first_call(scorer, clips):
    """Issue 45, L8: every step printed "Both `max_new_tokens` and `max_length` seem to have been set".
    The limit goes as the `max_length` Whisper's generate reads (new tokens), so the tokens are
    the ones `max_new_tokens` gives. Whisper's own generate passes its suppress tokens beside its
    generation config, which transformers warns about once per process (warning_once): the first
    call may print that, never anything after it."""
    import logging

    from transformers.utils import logging as hf_logging

    waves = [(clips["voice"], RATE), (clips["tone"], RATE)]
    scorer.transcribe(waves)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    hf_logging.get_logger().addHandler(handler)
    try:
        transcripts = scorer.transcribe(waves)
    finally:
        hf_logging.get_logger().removeHandler(handler)
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
    features = scorer.processor.feature_extractor([c[: scorer.window].numpy() for c, _ in waves], sampling_rate=RATE,
                                                  return_tensors="pt", return_attention_mask=True)
    tokens = scorer.model.generate(features["input_features"], attention_mask=features["attention_mask"],
                                   language="en", task="transcribe", max_new_tokens=8, do_sample=False, num_beams=1)
    assert transcripts == scorer.processor.batch_decode(tokens, skip_special_tokens=True)

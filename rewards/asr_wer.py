"""ASR reward: how well a Whisper model's transcript of the speech matches the text it was asked
to say (transformers' `WhisperForConditionalGeneration` + `WhisperProcessor`).

    asr_wer = max(0, 1 - WER(reference, transcript))          in [0, 1], 1 = every word right

WER (word error rate) is (substitutions + deletions + insertions) / reference words; with
`metric: cer` (the default for `language` zh, yue and ja, written without spaces between words)
it is counted over characters instead. Insertions can push the error rate past 1, hence the
clamp. The reference is `metadata[text_key]` (default `spoken_text`, which a talker stage puts
in each sample's metadata; or a field of the prompt rows). A reference with no words scores 1
when the transcript is empty too, else 0. The maths and the text normalisation are
`rewards.transcripts`: both sides NFKC, lowercase, punctuation and symbols stripped, whitespace
collapsed. Whisper's English normaliser (numbers to digits, British to American spelling, "mr."
to "mister"; `EnglishTextNormalizer` with the checkpoint's normalizer.json) is *not* used by
default; `normalizer: whisper_english` applies it to both sides before that normalisation.

Audio input (`samples`): the contract of `rewards.audio_inputs` (a `MediaSamples` with audio, or
mono clips with their rates); clips are mixed down to mono and resampled to the feature
extractor's rate (16 kHz) with `omni_rl.utils.audio.resample` (windowed sinc). Whisper hears
30-second windows: a longer clip is cut to its first window, so words spoken after 30 s count as
deleted (keep speech under 30 s, e.g. with the talker's `rollout.max_new_tokens`). Decoding is
greedy (one beam, no sampling, no temperature fallback), `task="transcribe"` in `language`
(None: Whisper detects it per clip), so a clip's transcript does not depend on a random draw;
the whole batch is transcribed at once in fp32, eval mode, no gradients.

Options:
    model           a `WhisperForConditionalGeneration` (default `openai/whisper-large-v3`): hub
                    id, local folder, or `tiny:whisper-reward`.
    processor       where to load the `WhisperProcessor` from (default: `model`).
    language        the language spoken (default `en`; a Whisper language code or name; None =
                    detected per clip).
    metric          `wer` or `cer` (default None: `cer` for zh, yue and ja, else `wer`).
    text_key        the metadata key holding the reference text (default `spoken_text`).
    normalizer      `basic` (default) or `whisper_english` (see above).
    max_new_tokens  the transcript's length limit in tokens (default 224; Whisper's decoder
                    holds 448 positions).
    sample_rate     the rate of clips whose metadata has no `sample_rate` (default None).
    device          `auto` or a device name (`omni_rl.device.pick_device`).

At load, a run whose model puts no `text_key` in its samples' metadata
(`OmniModelBase.sample_metadata_keys`) and whose prompts do not carry it either is refused
(`needs_metadata`, checked by `omni_rl.reward.prompt_checks.check_reward_prompts`).

Left out: long-form (> 30 s) transcription and timestamps. The transcripts are not returned with
the scores; `AsrWerScorer.transcribe(clips)` gives them to whoever wants to show them.
"""
from __future__ import annotations

import numbers
from typing import Any, Sequence

import torch

from omni_rl.device import pick_device
from omni_rl.reward import register_reward
from omni_rl.utils.audio import resample
from rewards.audio_inputs import audio_clips, check_sample_rate
from rewards.pretrained import device_network, load_pretrained
from rewards.transcripts import error_rate, reference_texts

DEFAULT_MODEL = "openai/whisper-large-v3"
# Languages written without spaces between words: scored per character by default.
CHARACTER_LANGUAGES = frozenset({"zh", "chinese", "mandarin", "yue", "cantonese", "ja", "japanese"})
METRICS = {"wer": "words", "cer": "characters"}
NORMALIZERS = ("basic", "whisper_english")


class AsrWerScorer:
    def __init__(self, model: str, processor: str | None, language: str | None, metric: str | None,
                 text_key: str, normalizer: str, max_new_tokens: int, sample_rate: int | None, device: str):
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        self.language, self.text_key, self.sample_rate = language, text_key, sample_rate
        self.unit = METRICS[metric or default_metric(language)]
        self.max_new_tokens = max_new_tokens
        self.device = pick_device(device)
        self.model = load_pretrained(WhisperForConditionalGeneration, model, "model", "asr_wer").to(self.device).eval()
        self.processor = load_pretrained(WhisperProcessor, processor or model, "processor", "asr_wer")
        extractor = self.processor.feature_extractor
        self.rate, self.window = int(extractor.sampling_rate), int(extractor.n_samples)
        positions = int(self.model.config.max_target_positions)
        if max_new_tokens > positions - 4:  # the prompt takes 4: start, language, task, no-timestamps
            raise ValueError(
                f"asr_wer: max_new_tokens={max_new_tokens}; expected at most {positions - 4} ({model!r} decodes "
                f"{positions} positions, 4 of them the prompt)"
            )
        self.english = None
        if normalizer == "whisper_english":
            if self.processor.tokenizer.english_spelling_normalizer is None:
                raise ValueError(
                    f"asr_wer: normalizer='whisper_english' needs the tokenizer's normalizer.json (its spelling "
                    f"map), which processor={processor or model!r} lacks; use normalizer=basic or a Whisper "
                    f"checkpoint that ships it"
                )
            self.english = self.processor.tokenizer.normalize

    @torch.no_grad()
    def transcribe(self, clips: list[tuple[torch.Tensor, int]]) -> list[str]:
        """Whisper's greedy transcript of each (mono clip, rate), cut to its first 30 s window."""
        waves = [resample(clip, rate, self.rate)[: self.window].numpy() for clip, rate in clips]
        features = self.processor.feature_extractor(
            waves, sampling_rate=self.rate, return_tensors="pt", return_attention_mask=True,
        )
        tokens = self.model.generate(
            features["input_features"].to(self.device, torch.float32),
            attention_mask=features["attention_mask"].to(self.device),
            # `max_length` as Whisper's generate reads it: new tokens, to which it adds its prompt
            # (start, language, task, no-timestamps). The same limit as `max_new_tokens`, which
            # transformers pairs with the checkpoint's default max_length of 20 and warns about on
            # every call.
            language=self.language, task="transcribe", max_length=self.max_new_tokens,
            do_sample=False, num_beams=1,
        )
        return self.processor.batch_decode(tokens, skip_special_tokens=True)

    def scores(self, references: Sequence[str], transcripts: Sequence[str]) -> list[float]:
        """max(0, 1 - error rate) of each transcript against its reference."""
        if self.english is not None:
            references = [self.english(text) for text in references]
            transcripts = [self.english(text) for text in transcripts]
        return [max(0.0, 1.0 - error_rate(ref, hyp, self.unit)) for ref, hyp in zip(references, transcripts)]

    def __call__(self, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        clips = audio_clips("asr_wer", samples, prompts, metadata, self.sample_rate)
        references = reference_texts("asr_wer", metadata, self.text_key)
        return self.scores(references, self.transcribe(clips))


def default_metric(language: str | None) -> str:
    """`cer` for a language written without spaces between words, else `wer`."""
    return "cer" if language is not None and language.lower() in CHARACTER_LANGUAGES else "wer"


def is_whisper_language(language: Any) -> bool:
    """Whether Whisper's generate takes `language`: a code (en), a name (english) or a token (<|en|>)."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES, TO_LANGUAGE_CODE

    if not isinstance(language, str):
        return False
    key = language.lower()
    if key.startswith("<|") and key.endswith("|>"):
        key = key[2:-2]
    return key in LANGUAGES or key in TO_LANGUAGE_CODE


def _check_options(*, language: str | None = "en", metric: str | None = None, text_key: str = "spoken_text",
                   normalizer: str = "basic", max_new_tokens: int = 224, sample_rate: int | None = None,
                   **_: Any) -> None:
    if language is not None and not is_whisper_language(language):
        raise ValueError(f"language={language!r}; expected a Whisper language code or name (e.g. en, zh, english: "
                         f"one of the 100 of transformers' WhisperTokenizer), or null to detect it per clip")
    if metric is not None and metric not in METRICS:
        raise ValueError(f"metric={metric!r}; expected wer, cer, or None (cer for zh, yue and ja, else wer)")
    if not isinstance(text_key, str) or not text_key:
        raise ValueError(f"text_key={text_key!r}; expected the metadata key holding the text to speak")
    if normalizer not in NORMALIZERS:
        raise ValueError(f"normalizer={normalizer!r}; expected one of {', '.join(NORMALIZERS)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}; expected an int >= 1")
    check_sample_rate("asr_wer", sample_rate)


def _text_key(*, text_key: str = "spoken_text", **_: Any) -> set[str]:
    return {text_key}


@register_reward("asr_wer", modalities={"audio"}, check_options=_check_options, needs_metadata=_text_key,
                 device_networks=device_network("WhisperForConditionalGeneration", "model", DEFAULT_MODEL, "asr_wer"))
def asr_wer(
    *, model: str = DEFAULT_MODEL, processor: str | None = None, language: str | None = "en",
    metric: str | None = None, text_key: str = "spoken_text", normalizer: str = "basic",
    max_new_tokens: int = 224, sample_rate: int | None = None, device: str = "auto",
) -> AsrWerScorer:
    """max(0, 1 - WER) (CER for zh/yue/ja) of Whisper's transcript against metadata[text_key]."""
    return AsrWerScorer(model, processor, language, metric, text_key, normalizer, max_new_tokens, sample_rate, device)

"""Speaker similarity reward: how much the speech sounds like a reference voice, by a speaker
verification model (transformers' `WavLMForXVector` and its feature extractor).

    speaker_similarity = cos(xvector(sample), xvector(reference))          in [-1, 1]

`reference_audio` (a WAV file, required) is checked when a run starts (`check_files`: too short,
silent, too long or damaged is one line naming the file) and embedded once; each clip is
embedded on its own, so a score does not depend on its batch. Not Seed-TTS-eval's SIM
(docs/models.md, Reward details). Options: `reference_audio`, `model`
(`microsoft/wavlm-base-plus-sv`), `feature_extractor`, `sample_rate`, `device`.

Left out: voice cloning, several reference voices, per-prompt references.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from omni_rl.device import pick_device
from omni_rl.errors import OmniConfigError
from omni_rl.reward import register_reward
from omni_rl.utils.audio import resample
from rewards.audio_inputs import audio_clips, check_sample_rate
from rewards.pretrained import device_network, load_pretrained

DEFAULT_MODEL = "microsoft/wavlm-base-plus-sv"
# The bounds of a reference voice (see the module docstring for why each).
MIN_REFERENCE_SECONDS = 0.5
MAX_REFERENCE_SECONDS = 60.0
SILENCE_RMS = 1e-3
# 60 s at 96 kHz, 32-bit, 2 channels is 46 MB: a larger file cannot be a reference within the bound.
MAX_REFERENCE_BYTES = 64 * 2 ** 20


def read_reference(path: Any) -> tuple[torch.Tensor, int]:
    """The reference voice: (float32 mono clip in [-1, 1], sample rate). A missing file, one that
    is not an integer-PCM WAV, and a voice too short, silent or too long (the module docstring's
    bounds) raise `OmniConfigError` naming `reference_audio`."""
    from omni_rl.data.wav import read_wav

    expected = "expected a WAV file (integer PCM) of the voice the samples should sound like"
    if not isinstance(path, (str, Path)) or not str(path):
        raise OmniConfigError(f"reference_audio={path!r}; {expected}")
    file = Path(path).expanduser()
    if not file.is_file():
        what = "is a folder" if file.is_dir() else "no such file"
        raise OmniConfigError(f"reference_audio={str(path)!r}: {what}; {expected}")
    where = f"reference_audio={str(path)!r}"
    size = file.stat().st_size
    if size > MAX_REFERENCE_BYTES:
        raise OmniConfigError(
            f"{where}: the file is {size / 2 ** 20:.0f} MiB, more than a reference voice of at most "
            f"{MAX_REFERENCE_SECONDS:.0f} s can be ({MAX_REFERENCE_BYTES // 2 ** 20} MiB); cut a few seconds of the "
            f"voice (5-20 s of clean speech) into a file of its own"
        )
    samples, rate = read_wav(file.read_bytes(), where)
    seconds = samples.size / rate
    if seconds < MIN_REFERENCE_SECONDS:
        raise OmniConfigError(
            f"{where}: {seconds:.3f} s of audio ({samples.size} samples at {rate} Hz); a reference voice is at least "
            f"{MIN_REFERENCE_SECONDS} s of speech: use a longer recording (5-20 s of clean speech)"
        )
    if seconds > MAX_REFERENCE_SECONDS:
        raise OmniConfigError(
            f"{where}: {seconds:.1f} s of audio; a reference voice is at most {MAX_REFERENCE_SECONDS:.0f} s (it is "
            f"embedded in one forward, whose memory grows with the square of its length): cut 5-20 s of clean "
            f"speech into a file of its own"
        )
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    if rms < SILENCE_RMS:
        level = f"{20 * np.log10(rms):.0f} dBFS" if rms > 0 else "all zeros"
        raise OmniConfigError(
            f"{where}: the audio is silent (RMS {rms:.2e} of full scale, {level}; a voice is above {SILENCE_RMS:g}, "
            f"-60 dBFS): a muted microphone or a wrong channel? Record or pick the file again"
        )
    return torch.from_numpy(samples.copy()), int(rate)


def min_input_samples(config: Any) -> int:
    """The shortest waveform `WavLMForXVector` embeds: its convolutional feature encoder must
    yield the frames the TDNN layers' kernels and dilations span, plus one."""
    # Two frames out of the TDNN: its statistics pooling takes an unbiased std over them.
    length = 2 + sum((k - 1) * d for k, d in zip(config.tdnn_kernel, config.tdnn_dilation))
    for kernel, stride in zip(reversed(config.conv_kernel), reversed(config.conv_stride)):
        length = (length - 1) * stride + kernel  # the shortest input giving `length` outputs
    return length


class SpeakerSimilarityScorer:
    def __init__(self, reference_audio: str, model: str, feature_extractor: str | None, sample_rate: int | None,
                 device: str):
        from transformers import AutoFeatureExtractor, WavLMForXVector

        check_sample_rate("speaker_similarity", sample_rate)
        reference = read_reference(reference_audio)
        self.sample_rate = sample_rate
        self.device = pick_device(device)
        self.model = load_pretrained(WavLMForXVector, model, "model", "speaker_similarity").to(self.device).eval()
        self.extractor = load_pretrained(
            AutoFeatureExtractor, feature_extractor or model, "feature_extractor", "speaker_similarity",
        )
        self.rate = int(self.extractor.sampling_rate)
        self.min_samples = min_input_samples(self.model.config)
        self.reference = self.embed(*reference)

    @torch.no_grad()
    def embed(self, clip: torch.Tensor, rate: int) -> torch.Tensor:
        """The unit-length x-vector [D] of one mono clip at `rate`."""
        wave = resample(clip, rate, self.rate)
        if wave.numel() < self.min_samples:
            wave = torch.nn.functional.pad(wave, (0, self.min_samples - wave.numel()))
        features = self.extractor(wave.numpy(), sampling_rate=self.rate, return_tensors="pt")
        # One unpadded clip: no attention mask (it would be all ones).
        embedding = self.model(features["input_values"].to(self.device, torch.float32)).embeddings[0].float()
        return torch.nn.functional.normalize(embedding, dim=-1)

    def __call__(self, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        clips = audio_clips("speaker_similarity", samples, prompts, metadata, self.sample_rate)
        embeddings = torch.stack([self.embed(clip, rate) for clip, rate in clips])
        return (embeddings @ self.reference).clamp(-1.0, 1.0).cpu().tolist()


def _check_options(*, reference_audio: Any = None, sample_rate: int | None = None, **_: Any) -> None:
    """At config load: a reference voice is named (the file is read when a run starts)."""
    if not isinstance(reference_audio, str) or not reference_audio:
        raise ValueError(f"reference_audio={reference_audio!r}: expected the path of a WAV file (integer PCM) of the "
                         f"voice the samples should sound like")
    check_sample_rate("speaker_similarity", sample_rate)


def _check_files(*, reference_audio: Any = None, **_: Any) -> None:
    """When a run starts, before any model loads: the reference voice reads and is a voice (a
    missing, non-WAV, too short, silent or too long file is one line)."""
    read_reference(reference_audio)


@register_reward("speaker_similarity", modalities={"audio"}, check_options=_check_options, check_files=_check_files,
                 device_networks=device_network("WavLMForXVector", "model", DEFAULT_MODEL, "speaker_similarity"))
def speaker_similarity(
    *, reference_audio: str, model: str = DEFAULT_MODEL, feature_extractor: str | None = None,
    sample_rate: int | None = None, device: str = "auto",
) -> SpeakerSimilarityScorer:
    """Cosine similarity in [-1, 1] of each clip's WavLM x-vector with the reference voice's."""
    return SpeakerSimilarityScorer(reference_audio, model, feature_extractor, sample_rate, device)

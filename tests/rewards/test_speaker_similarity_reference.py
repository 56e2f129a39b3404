"""speaker_similarity's reference voice is checked when a run starts, before any model loads
(issue 45, H1, M1, L2): too short, silent, too long or with a sample rate of 0, each one
`error:` line and exit 2. The WAVs are written here: zeros, one sample, ten minutes (a header
and its data), and a voice-like signal (a sum of sines with noise) that passes."""
import math
import struct
import wave

import numpy as np
import pytest

from omni_rl.cli import main
from omni_rl.reward.registry import RewardConfigError, check_reward_files

TK = "recipe=tiny_qwen3_omni_talker_grpo"


def write_pcm(path, samples: np.ndarray, rate: int = 16000) -> str:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2").tobytes())
    return str(path)


def voice_like(seconds: float, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    tones = sum(a * np.sin(2 * math.pi * f * t) for a, f in ((0.3, 140), (0.2, 280), (0.1, 560), (0.05, 1200)))
    return tones + 0.01 * np.random.default_rng(0).standard_normal(t.size)


def run_line(capsys, tmp_path, reference: str) -> str:
    reward = f"reward.rewards=[{{name: speaker_similarity, reward_options: {{reference_audio: '{reference}', " \
             f"model: tiny:wavlm-sv-reward}}}}]"
    code = main([TK, reward, "trainer.total_steps=1", "trainer.val_every=0", f"trainer.output_dir={tmp_path / 'out'}"])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert "Traceback" not in captured.err and len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert not (tmp_path / "out").exists()  # nothing was written: the model never loaded
    prefix = f"error: reward.rewards[0].reward_options: reward 'speaker_similarity': reference_audio='{reference}': "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0][len(prefix):]


def test_one_second_of_zeros_is_silent(capsys, tmp_path):
    path = write_pcm(tmp_path / "silence.wav", np.zeros(16000))
    assert run_line(capsys, tmp_path, path) == (
        "the audio is silent (RMS 0.00e+00 of full scale, all zeros; a voice is above 0.001, -60 dBFS): a muted "
        "microphone or a wrong channel? Record or pick the file again")


def test_quiet_dither_is_silent(tmp_path):
    # +-1 LSB of 16-bit noise: RMS ~3e-5, -90 dBFS.
    noise = np.random.default_rng(1).integers(-1, 2, 16000) / 32767
    path = write_pcm(tmp_path / "dither.wav", noise)
    with pytest.raises(RewardConfigError, match=r"the audio is silent \(RMS 2\.\d\de-05 of full scale, -9\d dBFS"):
        check_reward_files("speaker_similarity", {"reference_audio": path})


def test_one_sample_is_too_short(capsys, tmp_path):
    path = write_pcm(tmp_path / "one.wav", np.array([0.5]))
    assert run_line(capsys, tmp_path, path) == (
        "0.000 s of audio (1 samples at 16000 Hz); a reference voice is at least 0.5 s of speech: use a longer "
        "recording (5-20 s of clean speech)")


def test_ten_minutes_is_too_long(capsys, tmp_path):
    # A header and ten minutes of 16 kHz data (19 MB), written without building the signal.
    path = tmp_path / "long.wav"
    n = 600 * 16000
    fmt = struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)
    with open(path, "wb") as out:
        out.write(b"RIFF" + struct.pack("<I", 36 + 2 * n) + b"WAVEfmt " + struct.pack("<I", 16) + fmt)
        out.write(b"data" + struct.pack("<I", 2 * n))
        block = (np.sin(np.arange(16000) * 0.1) * 8000).astype("<i2").tobytes()
        for _ in range(600):
            out.write(block)
    line = run_line(capsys, tmp_path, str(path))
    assert line.startswith("600.0 s of audio; a reference voice is at most 60 s (it is embedded in one forward")


def test_a_file_too_large_for_any_reference_is_not_read(tmp_path):
    path = tmp_path / "huge.wav"
    with open(path, "wb") as out:
        out.truncate(65 * 2 ** 20)  # sparse: 65 MiB that are never read
    with pytest.raises(RewardConfigError, match=r"the file is 65 MiB, more than a reference voice of at most 60 s"):
        check_reward_files("speaker_similarity", {"reference_audio": str(path)})


def test_a_sample_rate_of_zero(capsys, tmp_path):
    path = tmp_path / "rate0.wav"
    pcm = (voice_like(1.0) * 32767).astype("<i2").tobytes()
    fmt = struct.pack("<HHIIHH", 1, 1, 0, 0, 2, 16)
    path.write_bytes(b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " + struct.pack("<I", 16) + fmt
                     + b"data" + struct.pack("<I", len(pcm)) + pcm)
    assert run_line(capsys, tmp_path, str(path)).startswith("the WAV header gives a sample rate of 0 Hz")


def test_a_voice_like_reference_passes(tmp_path):
    for seconds in (0.5, 3.0, 60.0):
        path = write_pcm(tmp_path / f"voice_{seconds}.wav", voice_like(seconds))
        check_reward_files("speaker_similarity", {"reference_audio": path})

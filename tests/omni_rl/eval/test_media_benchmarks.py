"""`speech_wer_similarity` on the tiny talker and `video_clip_consistency` on the tiny Wan2.2, end to end.

The models and scorers are tiny random ones (`tiny:qwen3_omni_talker`, `tiny:wan22`,
`tiny:whisper-reward`, `tiny:wavlm-sv-reward`, `tiny:clip-reward` and an aesthetic head written
here), so the numbers mean nothing: the tests check that each sample is drawn, kept on disk in
its format (WAV; mp4 with a first-frame poster) and scored by every scorer, that the figures
are the records' means, and what the protocol records.
"""
import json
import math
import wave

import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.eval.job import EvalRequest, run_eval
from rewards.tiny_models import write_aesthetic_head


def evaluate(recipe, benchmark, prompts, out, protocol):
    cfg = load_config(recipe)
    return run_eval(cfg, EvalRequest(benchmark, prompts=str(prompts), out=str(out), protocol=tuple(protocol)),
                    progress=False)


def records(out, n):
    return [json.loads((out / "prompts" / f"{i:06d}.json").read_text()) for i in range(n)]


def write_voice(path, rate=16000):
    t = torch.arange(rate // 2) / rate
    pcm = (0.5 * torch.sin(2 * math.pi * 220 * t) * 32767).round().to(torch.int16)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(pcm.numpy().astype("<i2").tobytes())


def test_speech_keeps_each_utterance_as_a_wav_scored_by_asr_and_speaker_similarity(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Say hello.\nName a colour.\nCount to two.\n")
    voice = tmp_path / "voice.wav"
    write_voice(voice)
    protocol = ["asr_wer.model=tiny:whisper-reward", "asr_wer.max_new_tokens=8",
                "speaker_similarity.model=tiny:wavlm-sv-reward", f"speaker_similarity.reference_audio={voice}"]
    out = tmp_path / "out"
    results = evaluate(["recipe=tiny_qwen3_omni_talker_grpo"], "speech_wer_similarity", prompts, out, protocol)
    assert results["counts"] == {"prompts": 3, "samples": 3}
    p = results["protocol"]
    # Greedy answers; the recipe's speech temperature and utterance length, recorded.
    assert (p["temperature"], p["speech_temperature"], p["max_frames"], p["max_new_tokens"]) == (0.0, 1.0, 16, 6)
    kept = [r["samples"][0] for r in records(out, 3)]
    for sample in kept:
        with wave.open(str(out / sample["file"])) as f:
            assert f.getnframes() > 0
        assert isinstance(sample["spoken_text"], str) and 1 <= sample["frames"] <= 16
        assert 0.0 <= sample["scores"]["asr_wer"] <= 1.0 and -1.0 <= sample["scores"]["speaker_similarity"] <= 1.0
    for metric, reward in (("asr_accuracy", "asr_wer"), ("speaker_similarity", "speaker_similarity")):
        assert results["figures"][metric]["mean"] == pytest.approx(sum(s["scores"][reward] for s in kept) / 3)


def test_speech_protocol_max_frames_bounds_the_utterances_not_the_recipes(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Say hello.\nName a colour.\nCount to two.\n")
    voice = tmp_path / "voice.wav"
    write_voice(voice)
    protocol = ["max_frames=2", "asr_wer.model=tiny:whisper-reward", "asr_wer.max_new_tokens=8",
                "speaker_similarity.model=tiny:wavlm-sv-reward", f"speaker_similarity.reference_audio={voice}"]
    out = tmp_path / "out"
    results = evaluate(["recipe=tiny_qwen3_omni_talker_grpo"], "speech_wer_similarity", prompts, out, protocol)
    assert results["protocol"]["max_frames"] == 2  # the recipe's rollout.sampling_options.max_frames is 16
    frames = [r["samples"][0]["frames"] for r in records(out, 3)]
    # The tiny talker at temperature 1 rarely stops within 16 frames: 2 is reached, never passed.
    assert max(frames) == 2 and min(frames) >= 1, frames


def test_speech_without_a_reference_voice_is_one_error_naming_the_option(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Say hello.\n")
    with pytest.raises(Exception, match="reference_audio.*--protocol speaker_similarity.OPTION=VALUE"):
        evaluate(["recipe=tiny_qwen3_omni_talker_grpo"], "speech_wer_similarity", prompts, tmp_path / "out", [])


def test_video_keeps_an_mp4_and_scores_clip_aesthetic_and_frame_consistency(tmp_path):
    prompts = tmp_path / "captions.txt"
    prompts.write_text("a cat running\na whale\n")
    head = tmp_path / "head.safetensors"
    write_aesthetic_head(head, 16)
    protocol = ["clip_score.model=tiny:clip-reward", "aesthetic.model=tiny:clip-reward", f"aesthetic.head={head}",
                "clip_frame_consistency.model=tiny:clip-reward", "num_steps=4"]
    out = tmp_path / "out"
    results = evaluate(["recipe=tiny_wan22_flowgrpo"], "video_clip_consistency", prompts, out, protocol)
    assert results["counts"] == {"prompts": 2, "samples": 2}
    p = results["protocol"]
    assert (p["num_steps"], p["num_frames"], p["fps"], p["height"]) == (4, 5, 16, 32)
    assert [s.get("video_frames") for s in p["scorers"]] == [8, 8, None]
    kept = [r["samples"][0] for r in records(out, 2)]
    for sample in kept:
        assert sample["file"].endswith(".mp4") and (out / sample["file"]).stat().st_size > 0
        assert (out / sample["poster"]).is_file()
        assert -1.0 <= sample["scores"]["clip_frame_consistency"] <= 1.0
    for metric, reward in (("clip_score", "clip_score"), ("aesthetic", "aesthetic"),
                           ("frame_consistency", "clip_frame_consistency")):
        assert results["figures"][metric]["mean"] == pytest.approx(sum(s["scores"][reward] for s in kept) / 2)
    assert (out / "grids" / "all.png").is_file()  # the posters


def test_a_video_benchmark_on_an_image_model_is_refused_before_it_loads(tmp_path):
    prompts = tmp_path / "captions.txt"
    prompts.write_text("a cat\n")
    head = tmp_path / "head.safetensors"
    write_aesthetic_head(head, 16)
    with pytest.raises(Exception, match="scorer 'clip_frame_consistency' scores video, and the recipe's model makes image"):
        evaluate(["recipe=tiny_sd3_shapes_counting"], "video_clip_consistency", prompts, tmp_path / "out",
                 [f"aesthetic.head={head}"])
    assert not (tmp_path / "out").exists()

"""The built-in speech and video benchmarks: `speech_wer_similarity` and `video_clip_consistency`.

`speech_wer_similarity` (family `talker`) scores greedy spoken answers by `asr_wer` and
`speaker_similarity`; `video_clip_consistency` (family `diffusion`) scores ODE samples by
`clip_score`, `aesthetic` and `clip_frame_consistency`. docs/evaluation.md tables both; neither
is comparable with Seed-TTS-eval or VBench.
"""
from __future__ import annotations

from omni_rl.eval.benchmark import Benchmark, Metric, PromptSource, register_benchmark
from omni_rl.eval.protocol import Protocol, ScorerSpec

register_benchmark(Benchmark(
    name="speech_wer_similarity",
    family="talker",
    description="The talker's speech: Whisper's word accuracy max(0, 1 - WER) against the text it was asked to "
                "speak, and WavLM speaker similarity with a reference voice.",
    prompts=PromptSource(format="txt, one prompt a line, or chat rows (.jsonl / .parquet)",
                         get="any prompt file; the talker speaks the thinker's answer to each prompt"),
    protocol=Protocol(samples_per_prompt=1, seed=0, temperature=0.0, top_p=1.0,
                      scorers=(ScorerSpec("asr_wer"), ScorerSpec("speaker_similarity"))),
    metrics=(Metric("asr_accuracy", "asr_wer"), Metric("speaker_similarity", "speaker_similarity")),
    headline="asr_accuracy",
))

_FRAMES = 8  # frames per video the image scorers see

register_benchmark(Benchmark(
    name="video_clip_consistency",
    family="diffusion",
    description="Per-frame CLIP score and aesthetic (8 evenly spaced frames, averaged) and frame-to-frame CLIP "
                "consistency of text-to-video samples; not VBench.",
    prompts=PromptSource(format="txt, one caption a line",
                         get="any caption file (e.g. a held-out split of the recipe's prompts)"),
    protocol=Protocol(samples_per_prompt=1, seed=0, scorers=(
        ScorerSpec("clip_score", video_frames=_FRAMES), ScorerSpec("aesthetic", video_frames=_FRAMES),
        ScorerSpec("clip_frame_consistency"))),
    metrics=(Metric("clip_score", "clip_score"), Metric("aesthetic", "aesthetic"),
             Metric("frame_consistency", "clip_frame_consistency")),
    headline="clip_score",
))

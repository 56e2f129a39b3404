"""The built-in speech and video benchmarks: `speech_wer_similarity` and `video_clip_consistency`.

`speech_wer_similarity` (family `talker`): each prompt is answered by the thinker greedily
(temperature 0), and the talker speaks the answer at the recipe's `speech_temperature` in at
most its `max_frames` frames (both recorded), one utterance per prompt, kept as a WAV. Scored by
- `asr_wer`: Whisper's (`openai/whisper-large-v3`, English, greedy) transcript against the
  text the talker was asked to speak; `asr_accuracy` = max(0, 1 - WER) (insertions past 100%
  clamp at 0, so 1 - its mean is a lower bound of the mean WER);
- `speaker_similarity`: the cosine of WavLM x-vectors (`microsoft/wavlm-base-plus-sv`) with a
  reference voice the user gives: `--protocol speaker_similarity.reference_audio=voice.wav`
  (an integer-PCM WAV). Not Seed-TTS-eval's SIM (another verification model; rewards/
  speaker_similarity.py says which).

`video_clip_consistency` (family `diffusion`, a video model): each caption is drawn once under
the recipe's sampler (steps, guidance, size, frames and fps, all recorded; deterministic ODE),
kept as an mp4, and scored by
- `clip_score`: CLIP ViT-L/14's cosine of the caption with 8 evenly spaced frames, averaged;
- `aesthetic`: the LAION aesthetic predictor v2 on those 8 frames, averaged; its head is not
  shipped: `--protocol aesthetic.head=sac+logos+ava1-l14-linearMSE.pth`;
- `clip_frame_consistency`: the mean cosine of consecutive frames' CLIP image embeddings.
It measures those three numbers and nothing else: it is not VBench and not comparable with it.
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

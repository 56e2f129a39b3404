"""`mmk12_greedy` and `mmk12_sampled`: MMK12-style answer accuracy of a text or omni model.

Each chat row is answered and scored by `math_answer` against its `ground_truth`: one greedy
answer, or k = 8 sampled ones (pass@1 and pass@k). The MMK12 test split is not shipped;
recipes/qwen3_omni_thinker_gspo_lora_mmk12.yaml shows how to convert it.
"""
from __future__ import annotations

from omni_rl.eval.benchmark import Benchmark, Metric, PromptSource, register_benchmark
from omni_rl.eval.protocol import Protocol, ScorerSpec

_PROMPTS = PromptSource(
    format="chat rows {prompt, images (optional), ground_truth} in .parquet or .jsonl (omni_rl/data/chat_prompts.py)",
    get="MMK12's test split (FanqingM/MMK12 on the Hugging Face hub), converted to chat rows as "
        "recipes/qwen3_omni_thinker_gspo_lora_mmk12.yaml shows",
)
_SCORERS = (ScorerSpec("math_answer"),)
_ACCURACY = (Metric("accuracy", "math_answer", binary=True),)

register_benchmark(Benchmark(
    name="mmk12_greedy",
    family="autoregressive",
    description="MMK12-style accuracy: one greedy answer per question, its last \\boxed{} checked against "
                "ground_truth by math_answer.",
    prompts=_PROMPTS,
    protocol=Protocol(samples_per_prompt=1, seed=0, temperature=0.0, top_p=1.0, scorers=_SCORERS),
    metrics=_ACCURACY,
    headline="accuracy",
))

register_benchmark(Benchmark(
    name="mmk12_sampled",
    family="autoregressive",
    description="MMK12-style accuracy over 8 sampled answers per question (temperature 1): accuracy.mean is "
                "pass@1 averaged over the samples, accuracy.prompts_any is pass@8.",
    prompts=_PROMPTS,
    protocol=Protocol(samples_per_prompt=8, seed=0, temperature=1.0, top_p=1.0, scorers=_SCORERS),
    metrics=_ACCURACY,
    headline="accuracy",
))

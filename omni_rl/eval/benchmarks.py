"""The built-in benchmarks: `geneval`, `ocr` and `pickscore` (text-to-image), each as its source defines it.

Protocols follow Flow-GRPO's evaluation of SD3.5-M (40 steps, CFG 4.5, 512 x 512); with
Flow-GRPO's `test_metadata.jsonl` (each prompt 4 times) pass `--protocol samples_per_prompt=1`.
Prompt files are not shipped. Importing this module also registers `mmk12` and `media_benchmarks`.
"""
from __future__ import annotations

from omni_rl.eval.benchmark import Benchmark, Metric, PromptSource, register_benchmark
from omni_rl.eval.protocol import Protocol, ScorerSpec

GENEVAL_TASKS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")

# Flow-GRPO's evaluation sampler for SD3.5-M.
_T2I = dict(num_steps=40, guidance_scale=4.5, height=512, width=512)

register_benchmark(Benchmark(
    name="geneval",
    family="diffusion",
    description="GenEval (Ghosh et al. 2023): object, count, colour and position rules checked by a COCO "
                "instance detector and a CLIP colour classifier; the score is the mean of the six task accuracies.",
    prompts=PromptSource(
        format="jsonl rows {tag, include, exclude, prompt} (GenEval's metadata)",
        get="djghosh13/geneval prompts/evaluation_metadata.jsonl (553 prompts), or Flow-GRPO's "
            "dataset/geneval/test_metadata.jsonl (the same prompts, 4 rows each: add --protocol samples_per_prompt=1)",
    ),
    protocol=Protocol(samples_per_prompt=4, seed=0, **_T2I, scorers=(ScorerSpec("geneval", (("score", "correct"),)),)),
    metrics=(
        Metric("accuracy", "geneval", detail="correct", binary=True),
        Metric("strict_accuracy", "geneval", detail="strict_correct", binary=True),
        Metric("partial_score", "geneval", detail="score"),
    ),
    headline="accuracy",
    task_of=lambda meta: meta.get("tag"),
    tasks=GENEVAL_TASKS,
))

register_benchmark(Benchmark(
    name="ocr",
    family="diffusion",
    description="Text rendering (Flow-GRPO's OCR task): the target is the prompt's first quoted span, scored "
                "by the `ocr` reward under Flow-GRPO's rule (1 where the target appears in the recognised text, "
                "else 1 - its edit distance over the target's length).",
    prompts=PromptSource(format="txt, one prompt a line, the target text in its first pair of double quotes",
                         get="Flow-GRPO's dataset/ocr/test.txt (1,018 prompts)"),
    protocol=Protocol(samples_per_prompt=1, seed=0, **_T2I, scorers=(ScorerSpec("ocr", (("rule", "flow_grpo"),)),)),
    metrics=(Metric("ocr_score", "ocr"), Metric("exact_match", "ocr", at_least=1.0, binary=True)),
    headline="ocr_score",
))

register_benchmark(Benchmark(
    name="pickscore",
    family="diffusion",
    description="PickScore (Kirstain et al. 2023) on Pick-a-Pic captions, the raw score (exp(logit_scale) x "
                "cosine, the paper's 21.72 -> 23.31 scale; training divides it by 26).",
    prompts=PromptSource(format="txt, one caption a line", get="Flow-GRPO's dataset/pickscore/test.txt (2,048 captions)"),
    protocol=Protocol(samples_per_prompt=1, seed=0, **_T2I, scorers=(ScorerSpec("pickscore", (("scale", 1.0),)),)),
    metrics=(Metric("pickscore", "pickscore"),),
    headline="pickscore",
))

# The other families' built-ins register in modules of their own; importing this one registers all.
from omni_rl.eval import media_benchmarks, mmk12  # noqa: E402,F401

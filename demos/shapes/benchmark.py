"""The shape demo's benchmarks: `geneval_shapes` (GenEval's six tasks on flat shapes) and `shapes_counting`.

Both sample as the demo validates (deterministic ODE, 12 steps, CFG 4.5, 32 x 32) and score with
`geneval_shapes` on success (every check of the caption passes: its `partial_credit=False`), so
their accuracy is what `demos.shapes.evaluate` and the demo's validation report.
- `geneval_shapes`: the held-out captions (`recipes/prompts/geneval_shapes_heldout.jsonl`), 4
  samples each; per task and overall as GenEval aggregates them.
- `shapes_counting`: the demo's four counting captions (`recipes/prompts/shapes_counting.txt`),
  64 samples each, as its validation draws them. Four prompts are too few for a prompt-level
  bootstrap, and every model draws each (caption, seed) pair from the same noise, so its
  comparison resamples samples (`pair_unit="sample"`).
"""
from __future__ import annotations

from demos.shapes.grammar import TASKS
from omni_rl.eval.benchmark import Benchmark, Metric, PromptSource, register_benchmark
from omni_rl.eval.protocol import Protocol, ScorerSpec

_SAMPLER = dict(num_steps=12, guidance_scale=4.5, height=32, width=32)
_SCORER = (ScorerSpec("geneval_shapes", (("partial_credit", False),)),)
_METRICS = (Metric("accuracy", "geneval_shapes", at_least=1.0, binary=True),)


def _task(meta: dict) -> str:
    return meta["geneval"]["task"]


register_benchmark(Benchmark(
    name="geneval_shapes",
    family="diffusion",
    description="GenEval's six task types on the shape demo's held-out captions, checked by the shape detector.",
    prompts=PromptSource(format="jsonl rows {prompt, metadata: {geneval: SceneSpec}} (demos.shapes.prompt_files)",
                         get="shipped", default="recipes/prompts/geneval_shapes_heldout.jsonl"),
    protocol=Protocol(samples_per_prompt=4, seed=1234, **_SAMPLER, scorers=_SCORER),
    metrics=_METRICS,
    headline="accuracy",
    task_of=_task,
    tasks=TASKS,
))

register_benchmark(Benchmark(
    name="shapes_counting",
    family="diffusion",
    description="The shape demo's four counting captions, 64 seeds each, as its validation draws them.",
    prompts=PromptSource(format="txt, one shape caption a line", get="shipped",
                         default="recipes/prompts/shapes_counting.txt"),
    protocol=Protocol(samples_per_prompt=64, seed=1234, **_SAMPLER, scorers=_SCORER),
    metrics=_METRICS,
    headline="accuracy",
    pair_unit="sample",
))

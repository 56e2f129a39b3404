"""Evaluation: benchmarks with pinned protocols, the job that runs them, and their comparison.

`benchmark` (the registry and spec), `job.run_eval`, `sampling` (one sampler per model family)
and `compare` (a paired bootstrap); the command line is `--eval BENCHMARK` and `--compare A B`
(docs/evaluation.md).
"""

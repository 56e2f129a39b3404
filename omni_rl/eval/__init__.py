"""Evaluation: benchmarks with pinned protocols, the job that runs them, and their comparison.

`omni_rl.eval.benchmark` holds the registry (`BENCHMARKS`, `register_benchmark`) and the spec a
benchmark declares; `omni_rl.eval.job.run_eval` evaluates a model on one, drawing its samples with
the sampler of the benchmark's model family (`omni_rl.eval.sampling`); `omni_rl.eval.compare`
compares two results with a paired bootstrap. The command line is `python main_omni.py
recipe=NAME --eval BENCHMARK` and `python main_omni.py --compare A B` (docs/evaluation.md).
"""

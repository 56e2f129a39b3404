"""The figures of `omni_rl.eval.aggregate` on records worked out by hand, and the paired bootstrap."""
import math

import numpy as np
import pytest

from omni_rl.eval.aggregate import figures, paired_bootstrap
from omni_rl.eval.benchmark import Benchmark, Metric, PromptSource
from omni_rl.eval.protocol import Protocol, ScorerSpec

BENCH = Benchmark(
    name="t", family="diffusion", description="", prompts=PromptSource("", ""),
    protocol=Protocol(samples_per_prompt=2, scorers=(ScorerSpec("r"),)),
    metrics=(Metric("acc", "r", binary=True),), headline="acc",
    task_of=lambda meta: meta["tag"], tasks=("a", "b"),
)


def record(index, tag, values, prompt=None):
    return {"index": index, "prompt": prompt or f"p{index}", "metadata": {"tag": tag},
            "samples": [{"sample": k, "metrics": {"acc": v}} for k, v in enumerate(values)]}


def test_task_means_overall_and_prompt_figures_by_hand():
    # Task a: prompts 0 and 1 with samples [1, 0] and [1, 1] -> 3/4; task b: prompt 2, [0, 0] -> 0.
    # overall = mean of task means = (0.75 + 0) / 2 = 0.375 (GenEval's "Overall score");
    # mean over the 6 samples = 3/6 = 0.5 ("% correct images"); prompts with any correct sample:
    # 0 and 1 of 3 -> 2/3 ("% correct prompts"); se = sqrt(var / n), var = 0.25 * 6/5 = 0.3.
    records = [record(0, "a", [1, 0]), record(1, "a", [1, 1]), record(2, "b", [0, 0])]
    fig = figures(BENCH, records)["acc"]
    assert fig["tasks"]["a"]["mean"] == pytest.approx(0.75) and fig["tasks"]["a"]["samples"] == 4
    assert fig["tasks"]["b"]["mean"] == pytest.approx(0.0)
    assert fig["overall"] == pytest.approx(0.375)
    assert fig["mean"] == pytest.approx(0.5)
    assert fig["prompts_any"] == pytest.approx(2 / 3)
    assert fig["se"] == pytest.approx(math.sqrt(0.3 / 6))


def test_rows_of_one_prompt_are_one_prompt_as_geneval_groups_them():
    # Flow-GRPO's test file lists each prompt 4 times: rows 0 and 1 are the same prompt and
    # metadata, so "% correct prompts" counts them once: prompt p (any of [0, 1] correct) and q
    # (none) -> 1/2, not 1/3.
    records = [record(0, "a", [0], prompt="p"), record(1, "a", [1], prompt="p"), record(2, "a", [0], prompt="q")]
    assert figures(BENCH, records)["acc"]["prompts_any"] == pytest.approx(0.5)


def test_paired_bootstrap_interval_holds_the_delta_and_is_zero_width_for_equal_results():
    rng = np.random.default_rng(0)
    a = [record(i, "ab"[i % 2], rng.integers(0, 2, 2).tolist()) for i in range(60)]
    same = paired_bootstrap(BENCH, a, a, draws=300)
    assert all(f["delta"] == 0 and f["low"] == 0 and f["high"] == 0 for f in same.values())
    # B: every sample of task a correct. Its task-a delta is positive and the interval excludes 0;
    # task b is unchanged (interval exactly 0).
    b = [record(r["index"], r["metadata"]["tag"], [1, 1] if r["metadata"]["tag"] == "a"
                else [s["metrics"]["acc"] for s in r["samples"]]) for r in a]
    out = paired_bootstrap(BENCH, a, b, draws=500)
    fa = out["acc/tasks/a"]
    assert fa["b"] == 1.0 and fa["delta"] == pytest.approx(1.0 - fa["a"])
    assert 0 < fa["low"] <= fa["delta"] <= fa["high"]
    assert out["acc/tasks/b"]["low"] == out["acc/tasks/b"]["high"] == 0
    assert out["acc/overall"]["a"] == pytest.approx(figures(BENCH, a)["acc"]["overall"])


def test_bootstrap_refuses_results_of_other_prompts():
    with pytest.raises(ValueError, match="different prompts"):
        paired_bootstrap(BENCH, [record(0, "a", [1, 0])], [record(0, "a", [1, 0], prompt="other")], draws=10)


def test_a_task_of_one_prompt_has_no_interval():
    # Task b has one prompt: resampling it gives its own value or nothing, never its spread.
    a = [record(0, "a", [1, 0]), record(1, "a", [0, 0]), record(2, "b", [0, 0])]
    b = [record(0, "a", [1, 1]), record(1, "a", [1, 0]), record(2, "b", [1, 1])]
    out = paired_bootstrap(BENCH, a, b, draws=200)
    assert out["acc/tasks/b"]["delta"] == 1.0 and math.isnan(out["acc/tasks/b"]["low"])
    assert out["acc/tasks/b"]["units"] == 1 and out["acc/tasks/a"]["units"] == 2
    assert math.isfinite(out["acc/tasks/a"]["low"]) and math.isfinite(out["acc/overall"]["low"])

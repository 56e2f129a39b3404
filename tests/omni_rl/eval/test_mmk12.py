"""`mmk12_greedy` and `mmk12_sampled` end to end on the tiny Qwen3 (`tiny_qwen3_grpo`).

The tiny model is random, so whether it answers right is chance: the tests check the plumbing
(rows, samples, records with the response texts, the figures pass@1 and pass@k), greedy
decoding's determinism across a rerun and across seeds, and pass@k >= pass@1.
"""
import json

import pytest

from omni_rl.compose import load_config
from omni_rl.eval.job import EvalRequest, run_eval

RECIPE = ["recipe=tiny_qwen3_grpo", "rollout.sampling_options.max_new_tokens=6"]
QUESTIONS = [("What is 1 + 1?", "2"), ("What is 3 x 3?", "9"), ("Half of 10?", "5")]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("mmk12") / "test.jsonl"
    rows = [{"prompt": q + " Put the final answer in \\boxed{}.", "ground_truth": a} for q, a in QUESTIONS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def evaluate(benchmark, prompts, out, protocol=()):
    cfg = load_config(RECIPE)
    request = EvalRequest(benchmark, prompts=str(prompts), out=str(out), protocol=tuple(protocol))
    return run_eval(cfg, request, progress=False)


def test_greedy_answers_are_recorded_and_the_same_on_a_rerun_and_for_other_seeds(prompts, tmp_path):
    results = evaluate("mmk12_greedy", prompts, tmp_path / "a")
    assert results["counts"] == {"prompts": 3, "samples": 3}
    p = results["protocol"]
    assert (p["temperature"], p["top_p"], p["max_new_tokens"], p["samples_per_prompt"]) == (0.0, 1.0, 6, 1)
    assert p["num_steps"] is None and p["height"] is None  # no diffusion field is claimed
    fig = results["figures"]["accuracy"]
    assert 0.0 <= fig["mean"] <= 1.0 and fig["samples"] == 3
    record = json.loads((tmp_path / "a" / "prompts" / "000001.json").read_text())
    sample = record["samples"][0]
    assert record["metadata"]["ground_truth"] == "9"
    assert isinstance(sample["text"], str) and 1 <= sample["tokens"] <= 6
    assert sample["metrics"]["accuracy"] in (0.0, 1.0) and sample["scores"]["math_answer"] == sample["metrics"]["accuracy"]
    assert not (tmp_path / "a" / "grids").exists()  # texts have no grid
    again = evaluate("mmk12_greedy", prompts, tmp_path / "b", protocol=["seed=7"])
    texts = [json.loads((tmp_path / d / "prompts" / f"{i:06d}.json").read_text())["samples"][0]["text"]
             for d in ("a", "b") for i in range(3)]
    assert texts[:3] == texts[3:]  # greedy: the seed does not matter
    assert again["figures"]["accuracy"]["mean"] == results["figures"]["accuracy"]["mean"]


def test_sampled_reports_pass_at_1_over_k_and_pass_at_k(prompts, tmp_path):
    results = evaluate("mmk12_sampled", prompts, tmp_path, protocol=["samples_per_prompt=4"])
    assert results["counts"] == {"prompts": 3, "samples": 12}
    assert results["protocol"]["temperature"] == 1.0
    records = [json.loads((tmp_path / "prompts" / f"{i:06d}.json").read_text()) for i in range(3)]
    correct = [[s["metrics"]["accuracy"] for s in r["samples"]] for r in records]
    fig = results["figures"]["accuracy"]
    # pass@1 averaged over the 4 samples, and pass@4: worked from the records themselves.
    assert fig["mean"] == pytest.approx(sum(map(sum, correct)) / 12)
    assert fig["prompts_any"] == pytest.approx(sum(max(c) for c in correct) / 3)
    assert fig["prompts_any"] >= fig["mean"]
    # Each sample has its own seed, so sampled answers differ somewhere.
    assert len({s["seed"] for r in records for s in r["samples"]}) == 12
    assert len({s["text"] for r in records for s in r["samples"]}) > 3


def test_a_diffusion_field_on_a_text_benchmark_is_refused_before_the_model_loads(prompts, tmp_path):
    with pytest.raises(Exception, match="num_steps are not read when sampling autoregressive models"):
        evaluate("mmk12_greedy", prompts, tmp_path, protocol=["num_steps=4"])
    assert not (tmp_path / "run.json").exists()

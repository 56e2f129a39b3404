"""`--eval geneval` end to end on a CPU, on rows of the official GenEval metadata.

The detector is a tiny Mask2Former and the colour classifier a tiny CLIP, built from configs
with the real transformers classes and loaded back through the real loading code
(`tiny:mask2former-coco`, `tiny:clip-reward`): their verdicts are meaningless. What this checks
is the plumbing and the protocol: every row reaches the rules with its clauses, each sample gets
a verdict with the rules' details, the six tasks are aggregated as GenEval does, and the result
records the protocol (with the tiny scorers as a change of it).
"""
import json

from omni_rl.compose import load_config
from omni_rl.eval.job import EvalRequest, run_eval
from tests.shared_data import shared_dataset

TINY = ("num_steps=2", "height=64", "width=64", "samples_per_prompt=1",
        "geneval.model=tiny:mask2former-coco", "geneval.clip_model=tiny:clip-reward")


def test_geneval_on_two_official_rows_of_each_task(tmp_path):
    rows = [json.loads(line) for line in shared_dataset("geneval/evaluation_metadata.jsonl").read_text().splitlines()]
    picked = [r for tag in ("single_object", "two_object", "counting", "colors", "position", "color_attr")
              for r in [r for r in rows if r["tag"] == tag][:2]]
    prompts = tmp_path / "rows.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in picked))
    out = tmp_path / "eval"
    results = run_eval(load_config(["recipe=tiny_sd3_flowgrpo"]),
                       EvalRequest("geneval", prompts=str(prompts), out=str(out), protocol=TINY), progress=False)
    figs = results["figures"]
    assert set(figs) == {"accuracy", "strict_accuracy", "partial_score"}
    assert set(figs["accuracy"]["tasks"]) == {"single_object", "two_object", "counting", "colors", "position",
                                              "color_attr"}
    assert all(t["samples"] == 2 for t in figs["accuracy"]["tasks"].values())
    for n, row in enumerate(picked):
        record = json.loads((out / "prompts" / f"{n:06d}.json").read_text())
        clauses = [k for k in ("tag", "include", "exclude") if k in row]  # some rows have no exclude
        assert {k: record["metadata"].get(k) for k in clauses} == {k: row[k] for k in clauses}
        verdict = record["samples"][0]["details"]["geneval"]
        assert set(verdict) >= {"correct", "strict_correct", "score", "reason"}
        assert record["samples"][0]["metrics"]["accuracy"] == float(verdict["correct"])
    scorer = results["protocol"]["scorers"][0]
    assert scorer["reward"] == "geneval" and scorer["kwargs"]["model"] == "tiny:mask2former-coco"
    assert results["protocol"]["num_steps"] == 2 and results["counts"] == {"prompts": 12, "samples": 12}

"""benchmarks/algorithms.py --merge: the runs of earlier results files join a new summary (no run
is started here: `--seeds` with no seed), and files of another benchmark or a repeated seed are
refused naming the file or the seed."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def benchmark():
    spec = importlib.util.spec_from_file_location("algorithms_benchmark", ROOT / "benchmarks" / "algorithms.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_record(seed, accuracies):
    curve = [{"step": s, "train_s": 10.0 * s, "accuracy": a, "n": 4, "per_task": {"geneval/counting": a}}
             for s, a in zip((0, 15, 30), accuracies)]
    return {"seed": seed, "wall_s": 1.0, "curve": curve, "rise_z": 1.0 + seed, "rise": accuracies[-1] - accuracies[0],
            "step_s_median": 2.0}


def results_file(path, seeds, module, steps=30):
    args = module.parse_args(["--algorithms", "flow_grpo", "--steps", str(steps)])
    runs = [run_record(s, [0.2, 0.25, 0.3 + 0.1 * s]) for s in seeds]
    record = {"benchmark": "algorithms", "recipe": args.recipe, "steps": steps, "val_every": args.val_every,
              "seeds": seeds, "overrides": {"flow_grpo": module.overrides_of("flow_grpo", args), "all": []},
              "results": {"flow_grpo": module.summarise(runs)}}
    path.write_text(json.dumps(record))
    return path


def test_two_files_merge_into_one_summary_over_all_seeds(tmp_path):
    module = benchmark()
    a = results_file(tmp_path / "a.json", [0], module)
    b = results_file(tmp_path / "b.json", [1, 2], module)
    out = tmp_path / "all.json"
    assert module.main(["--algorithms", "flow_grpo", "--seeds", "--merge", str(a), str(b), "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    summary = merged["results"]["flow_grpo"]
    assert merged["seeds"] == [0, 1, 2] and merged["merged_from"] == ["a.json", "b.json"]
    assert [r["seed"] for r in summary["runs"]] == [0, 1, 2]
    # Finals 0.3, 0.4, 0.5: mean 0.4, se = stdev 0.1 / sqrt 3.
    assert summary["final_accuracy"]["mean"] == pytest.approx(0.4)
    assert summary["final_accuracy"]["se"] == pytest.approx(0.1 / 3 ** 0.5)
    assert summary["rise_z"] == [1.0, 2.0, 3.0]
    assert out.with_suffix(".png").is_file()


def test_another_benchmark_or_a_repeated_seed_is_refused(tmp_path):
    module = benchmark()
    a = results_file(tmp_path / "a.json", [0], module)
    other = results_file(tmp_path / "other.json", [1], module, steps=10)
    with pytest.raises(ValueError, match="other.json: steps=10 but this run's is 30"):
        module.main(["--algorithms", "flow_grpo", "--seeds", "--merge", str(a), str(other), "--out", str(tmp_path / "x.json")])
    with pytest.raises(ValueError, match=r"flow_grpo: seed\(s\) \[0\] come from more than one place"):
        module.main(["--algorithms", "flow_grpo", "--seeds", "--merge", str(a), str(a), "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()

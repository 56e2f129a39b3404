"""`--eval` end to end on the tiny pretrained shape model: results, resume, shards, sources, errors.

The shape model and its detector are the demo's (`tiny:sd3_shapes`, `geneval_shapes`); a
protocol of 1 sample a prompt keeps each evaluation to seconds.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from omni_rl.compose import load_config
from omni_rl.eval.job import EvalRequest, run_eval
from omni_rl.eval.store import done_rows

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ["recipe=tiny_sd3_shapes_counting"]
FAST = ("samples_per_prompt=1",)


def evaluate(out, shard=(0, 1), model=None, protocol=FAST, benchmark="geneval_shapes"):
    cfg = load_config(RECIPE)
    return run_eval(cfg, EvalRequest(benchmark, out=str(out), shard=shard, model=model, protocol=protocol), progress=False)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    return out, evaluate(out)


def test_results_hold_the_six_tasks_the_protocol_and_the_model(whole):
    out, results = whole
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["figures"] == results["figures"]
    fig = results["figures"]["accuracy"]
    assert set(fig["tasks"]) == {"single_object", "two_object", "counting", "colors", "position", "color_attr"}
    assert fig["overall"] == pytest.approx(sum(t["mean"] for t in fig["tasks"].values()) / 6)
    assert results["counts"] == {"prompts": 43, "samples": 43}
    assert results["protocol"]["num_steps"] == 12 and results["protocol"]["samples_per_prompt"] == 1
    assert results["model"]["model.path"] == "tiny:sd3_shapes" and results["model"]["weights"] == "base"
    assert results["prompt_file"]["rows"] == 43 and len(results["prompt_file"]["sha256"]) == 64
    assert results["omni_rl_version"]
    record = json.loads((out / "prompts" / "000000.json").read_text())
    assert (out / record["samples"][0]["file"]).is_file()
    assert (out / "grids" / "counting.png").is_file()


def test_a_rerun_after_a_kill_skips_what_is_done_and_gives_the_same_numbers(whole, tmp_path):
    out, results = whole
    partial = tmp_path / "partial"
    shutil.copytree(out, partial)
    # What a kill leaves: some rows recorded, no results.json (the records are written atomically).
    (partial / "results.json").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in (partial / "prompts").glob("*.json") if int(p.stem) < 20}
    for p in (partial / "prompts").glob("*.json"):
        if int(p.stem) >= 20:
            p.unlink()
    again = evaluate(partial)
    assert again["figures"] == results["figures"]
    assert {p: (partial / "prompts" / p).stat().st_mtime_ns for p in kept} == kept  # not drawn again


def test_two_shards_give_the_whole_result(whole, tmp_path):
    _, results = whole
    assert evaluate(tmp_path, shard=(0, 2)) is None  # half the rows: no results yet
    assert done_rows(tmp_path) == set(range(0, 43, 2))
    sharded = evaluate(tmp_path, shard=(1, 2))
    assert sharded["figures"] == results["figures"]


def test_a_folder_of_another_protocol_is_refused_and_kept(whole):
    out, _ = whole
    before = sorted(p.name for p in (out / "prompts").iterdir())
    with pytest.raises(Exception, match="holds another evaluation.*protocol"):
        evaluate(out, protocol=("samples_per_prompt=2",))
    assert sorted(p.name for p in (out / "prompts").iterdir()) == before


def run_cli(*args):
    return subprocess.run([sys.executable, "main_omni.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("args, message", [
    (["--eval", "genevall"], "unknown benchmark 'genevall'; registered: "),
    (["--eval", "geneval"], "needs its prompt file"),
    (["--eval", "geneval_shapes", "--eval-prompts", "missing.jsonl"], "does not exist"),
    (["--eval", "geneval_shapes", "--eval-model", "nowhere/lora"], "--eval-model 'nowhere/lora' does not exist"),
    (["--eval", "geneval_shapes", "--shard", "2/2"], "--shard '2/2'"),
    (["--eval", "geneval_shapes", "--protocol", "steps=3"], "'steps' is no protocol field"),
    (["--eval-model", "x"], "--eval-model needs --eval"),
    (["--eval", "geneval", "--eval-prompts", "recipes/prompts/simple_animals.txt"], "is not a geneval prompt file"),
    (["--eval", "geneval_shapes", "--eval-weights", "ema"], "--eval-weights ema needs --eval-model"),
    (["--eval", "geneval_shapes", "--eval-weights", "best"], "--eval-weights 'best'"),
    (["--eval", "geneval_shapes", "model.path=no/such/model"], "model.path='no/such/model'"),
    (["--eval", "geneval_shapes", "trainer.device=cuda:7"], "trainer.device"),
])
def test_bad_input_is_one_error_line_before_any_model_loads(args, message, tmp_path):
    done = run_cli(*RECIPE, *args, "--eval-out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], done.stderr
    assert "Loading" not in done.stderr


def test_a_text_model_is_refused_for_an_image_benchmark(tmp_path):
    done = run_cli("recipe=tiny_qwen3_grpo", "--eval", "geneval_shapes", "--eval-out", str(tmp_path))
    assert done.returncode == 2 and "evaluates diffusion models" in done.stderr, done.stderr


@pytest.mark.long  # CI time: Ray's start-up dominates; the one-process job above checks the result
def test_ray_workers_give_the_whole_result(whole, tmp_path):
    from omni_rl.eval.ray_shards import run_on_ray

    _, results = whole
    cfg = load_config(RECIPE)
    spread = run_on_ray(cfg, EvalRequest("geneval_shapes", out=str(tmp_path), protocol=FAST), workers=2, progress=False)
    assert spread["figures"] == results["figures"]
    assert done_rows(tmp_path) == set(range(43))


def test_comparing_results_of_other_protocols_is_one_error_line(whole, tmp_path):
    out, _ = whole
    other = tmp_path / "other"
    evaluate(other, protocol=("samples_per_prompt=1", "num_steps=6"), )
    done = run_cli("--compare", str(out), str(other))
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "the protocols differ (num_steps: 12 vs 6)" in lines[0], done.stderr

"""`benchmarks/gpu_acceptance.py --dry-run`: the GPU acceptance script runs whole on a CPU.

The dry run collects the `gpu` tests, runs the native arm of the batching benchmark small and one
float32 step of two tiny recipes, and reports what needs CUDA or vllm as skipped with the reason;
its JSON names the machine and the package versions. (On a GPU the same script is the
acceptance run; nothing here needs one.)
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.long  # CI time; a session with a GPU dry-runs the script first (docs/benchmarks.md)
def test_the_dry_run_passes_and_reports_every_part(tmp_path):
    out = tmp_path / "acceptance.json"
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu_acceptance.py", "--dry-run", "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, env={**os.environ},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["dry_run"] is True
    assert {"torch", "diffusers", "vllm", "vllm-omni"} <= set(report["machine"]["packages"])
    parts = report["parts"]
    assert set(parts) == {"gpu_tests", "rollout_batching", "recipes", "sleep_wake", "memory_plan"}
    assert all(p["status"] in ("pass", "skipped") for p in parts.values()), parts
    assert parts["gpu_tests"]["collected"] > 0
    assert "vllm_omni arm not run" in parts["rollout_batching"]["reason"]
    assert parts["rollout_batching"]["tiny_sd3"] and parts["rollout_batching"]["tiny_qwen_image"]
    assert "needs CUDA and vllm-omni" in parts["sleep_wake"]["reason"]
    for recipe in ("tiny_sd3_flowgrpo", "tiny_qwen3_grpo"):
        assert parts["recipes"][recipe]["steps"] == 1, parts["recipes"]
    gpu_line = [line for line in result.stdout.splitlines() if line.startswith("gpu_acceptance on")]
    assert gpu_line and "[dry run]" in gpu_line[0]

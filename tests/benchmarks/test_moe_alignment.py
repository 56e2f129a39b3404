"""`benchmarks/moe_alignment.py` on a few samples: it writes every setting's measures, and under
r3 no token's routing differs from the rollout's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_writes_each_settings_measures(tmp_path):
    out = tmp_path / "moe.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/moe_alignment.py", "--prompts", "2", "--samples", "2", "--max-new-tokens", "8",
         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["settings"]) == {"off", "r2", "r3"}
    for measures in result["settings"].values():
        assert measures["tokens_compared"] > 0 and measures["response_tokens"] > 0
        assert 0 <= measures["routing_differs_fraction"] <= 1 and measures["logprob_abs_diff_max"] >= 0
        assert -1 <= measures["logprob_pearson"] <= 1 and measures["first_minibatch_ratio_mean"] > 0
    assert result["settings"]["r3"]["routing_differs_fraction"] == 0

"""`python main_omni.py --compare A B`: one table of two results' figures, B - A, with 95% intervals.

A and B must be of one benchmark, protocol and prompt file (otherwise one line names the
difference); the interval is `aggregate.paired_bootstrap` over the per-prompt records. The table
is printed, and written as `comparison.json` only when `out` is given.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from omni_rl.errors import OmniConfigError
from omni_rl.eval.aggregate import paired_bootstrap
from omni_rl.eval.benchmark import BENCHMARKS
from omni_rl.eval.protocol import differences
from omni_rl.eval.store import RESULTS_FILE, read_records
from omni_rl.utils.atomic import atomic_write_json


class CompareError(OmniConfigError):
    """Two results that cannot be compared, or a path that holds no result."""


def _load(path: str) -> tuple[Path, dict[str, Any]]:
    p = Path(path).expanduser()
    file = p / RESULTS_FILE if p.is_dir() else p
    if not file.is_file():
        raise CompareError(f"--compare {path!r}: no {RESULTS_FILE} there; name an evaluation's results.json or its "
                           f"folder (an unfinished evaluation has none: rerun its --eval)")
    try:
        return file.parent, json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CompareError(f"--compare {path!r}: {file} is unreadable ({err})") from None


def compare(path_a: str, path_b: str, draws: int = 2000, out: Optional[str] = None) -> dict[str, Any]:
    from omni_rl.eval import benchmarks as _builtin  # noqa: F401  (registers the built-in benchmarks)
    from omni_rl.plugins import load_plugins

    load_plugins(())
    folder_a, a = _load(path_a)
    folder_b, b = _load(path_b)
    if a["benchmark"] != b["benchmark"]:
        raise CompareError(f"--compare: A is {a['benchmark']} and B is {b['benchmark']}; compare results of one benchmark")
    diffs = differences(a["protocol"], b["protocol"])
    if diffs:
        raise CompareError(f"--compare: the protocols differ ({'; '.join(diffs)}); results are compared only under "
                           f"one protocol: re-evaluate one of them with the other's")
    if a["prompt_file"]["sha256"] != b["prompt_file"]["sha256"]:
        raise CompareError(f"--compare: the prompt files differ ({a['prompt_file']['path']} vs {b['prompt_file']['path']}, "
                           f"other contents); evaluate both on one file")
    benchmark = BENCHMARKS.get(a["benchmark"])
    try:
        table = paired_bootstrap(benchmark, read_records(folder_a), read_records(folder_b), draws=draws)
    except ValueError as err:
        raise CompareError(f"--compare: {err}") from None
    result = {"benchmark": benchmark.name, "protocol": a["protocol"], "a": {"path": str(folder_a), "model": a["model"]},
              "b": {"path": str(folder_b), "model": b["model"]}, "draws": draws, "figures": table}
    print(format_table(result))
    if out is not None:
        atomic_write_json(Path(out), result)
    return result


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{result['benchmark']}: B - A with 95% paired-bootstrap intervals ({result['draws']} draws)",
             f"A: {result['a']['path']} ({result['a']['model'].get('weights')})",
             f"B: {result['b']['path']} ({result['b']['model'].get('weights')})",
             f"{'figure':<34} {'A':>8} {'B':>8} {'B - A':>8}  95% interval"]
    for key, f in result["figures"].items():
        interval = (f"[{f['low']:+.4f}, {f['high']:+.4f}]" if math.isfinite(f["low"])
                    else f"n/a ({f['units']} unit: too few to resample)")
        lines.append(f"{key:<34} {f['a']:>8.4f} {f['b']:>8.4f} {f['delta']:>+8.4f}  {interval}")
    p = result["protocol"]
    lines.append("protocol: " + ", ".join(f"{k}={v}" for k, v in p.items() if k != "scorers" and v is not None))
    return "\n".join(lines)

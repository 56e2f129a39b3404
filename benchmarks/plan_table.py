"""Plan every real recipe (`python main_omni.py recipe=NAME --plan`, one process each) and print
docs/plan.md's table of them as markdown; the plans are kept in --out/NAME/plan.json.

    python benchmarks/plan_table.py --out outputs/plans [--recipes NAME ...] [--device-kind H800]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB = 1024**3


def real_recipes() -> list[str]:
    return sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml") if not p.stem.startswith("tiny_"))


def row(name: str, plan: dict, seconds: float) -> str:
    d, p, peaks, v = plan["devices"], plan["parameters"], plan["peaks"], plan["verdict"]
    devices = f"{d['world_size']} ({d['engine']}{' on Ray' if d['backend'] == 'ray' else ''}" \
              f"{', offload' if d['param_offload'] or d['optimizer_offload'] else ''})"
    traced = plan.get("trace") is not None
    fits = ("yes" if v["fits"] else "no") if traced else f"weights: {'yes' if v['fits'] else 'no'}"
    if "roofline" in plan:
        roof = plan["roofline"]
        best = (f"{roof['best_case_step_seconds']:.0f} (rollout {roof['rollout']['seconds']:.0f} {roof['rollout']['bound']}, "
                f"update {roof['update']['seconds']:.0f} {roof['update']['bound']})")
        flops = f"{plan['flops_per_step']['total']:.2e}"
    else:
        best = flops = "-"
    return (f"| `{name}` | {devices} | {p['total'] / 1e9:.2f}B / {p['trainable'] / 1e6:.1f}M | "
            f"{peaks['training'] / GIB:.1f} | {peaks['rollout'] / GIB:.1f} | "
            f"{plan['reward_models']['device_bytes'] / GIB:.1f} | {plan['driver']['total'] / GIB:.1f} | {fits} | "
            f"{flops} | {best} | {'yes' if traced else 'weights only'} | {seconds:.0f} |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "outputs" / "plans"))
    p.add_argument("--recipes", nargs="+", default=None)
    p.add_argument("--device-kind", default="H800")
    args = p.parse_args(argv)
    rows = []
    for name in args.recipes or real_recipes():
        out = Path(args.out) / name
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "main_omni.py", f"recipe={name}", f"trainer.output_dir={out}", "--plan",
                               "--device-kind", args.device_kind], cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{name}: plan failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}", file=sys.stderr)
            continue
        rows.append(row(name, json.loads((out / "plan.json").read_text()), time.monotonic() - started))
        print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()

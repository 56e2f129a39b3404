"""On-policy distillation of tokens on the CPU: tiny teachers that RL made, teaching a fresh tiny Qwen3.

Two experiments, each a few `python main_omni.py` runs in subprocesses:

- **One teacher.** GRPO teaches the tiny random Qwen3 to write lowercase letters
  (`recipe=tiny_qwen3_grpo`, exported to OUT/teacher_lowercase/model); that model teaches a
  fresh tiny Qwen3 (`recipe=tiny_qwen3_distill`: the reward-style form, the reward's weight 0).
  Reported: the per-token reverse KL (`distill/kl`) along the run, the held-out reward
  (`val/reward/char_match/mean` over 4 unseen prompts x 16 samples) of the base (the student's
  step 0), of the student at the end and of the teacher, with standard errors, and the sha256 of
  the teacher's weight file before and after the student's run.
- **Two teachers, two data sources.** A second teacher learns to write digits (the same recipe, the
  reward counting digits). One student is distilled from both: prompts of source `lowercase` by
  the first, of source `digits` by the second (`data_source` routing). Reported: each teacher's
  KL (`distill/<teacher>/kl`) along the run, and the KL matrix at the start (the base) and at the
  end: each source's samples scored by its own teacher and by the other (one more step each,
  one mini-batch scored before its update, the teachers' data sources swapped), so a source whose KL falls towards its
  own teacher and not the other's shows in the matrix.

    python benchmarks/token_distill.py                       # both, about 12 minutes on 2 shared CPU cores
    python benchmarks/token_distill.py --out /tmp/td.json --work /tmp/td

Writes `--out` (JSON, atomically) and prints a summary.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from omni_rl.utils.atomic import atomic_write_json  # noqa: E402

LOWER = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"
HELD_OUT = ["Describe the sea.", "Name a colour.", "Write a line.", "Say hello."]
QUIET = ["trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]"]
# The held-out validation of the one-teacher experiment, the same for the teacher's run and the student's.
VALIDATION = [f"data.val_prompts=[{', '.join(HELD_OUT)}]", "trainer.val_num_prompts=4",
              "trainer.val_samples_per_prompt=16"]
SOURCES = {
    "lowercase": ["Say something.", "Write a word.", "Tell me a story."],
    "digits": ["Count to three.", "Give a number.", "Add two and two."],
}


def reward(chars: str, weight: float = 1.0) -> str:
    return f"[{{name: char_match, weight: {weight}, reward_options: {{chars: '{chars}'}}}}]"


REUSE = False  # --reuse: a run whose folder holds its finished outputs is read, not run again


def main_omni(out: Path, overrides: list[str], log: Path) -> list[dict]:
    """One run; its metrics.jsonl records. A failed run raises with its last lines."""
    if REUSE and (out / "metrics.jsonl").is_file() and "done: outputs in" in (log.read_text() if log.is_file() else ""):
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    cmd = [sys.executable, "main_omni.py", *overrides, f"trainer.output_dir={out}", *QUIET]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    with open(log, "w") as f:
        result = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        tail = log.read_text().strip().splitlines()[-5:]
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}):\n" + "\n".join(tail))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def sha256_of(folder: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(folder.glob("*.safetensors")):
        digest.update(file.read_bytes())
    return digest.hexdigest()


def curve(records: list[dict], key: str) -> list[list[float]]:
    return [[r["step"], r[key]] for r in records if key in r]


def val_at(records: list[dict], step: int, key: str = "val/reward/char_match") -> dict:
    (r,) = [r for r in records if r["step"] == step and f"{key}/mean" in r]
    return {"mean": r[f"{key}/mean"], "std": r[f"{key}/std"]}


def se(point: dict, n: int) -> float:
    return point["std"] / math.sqrt(n)


def ends(points: list[list[float]], k: int = 5) -> dict:
    first, last = [v for _, v in points[:k]], [v for _, v in points[-k:]]
    return {"first": points[0][1], "last": points[-1][1], f"first_{k}_mean": sum(first) / len(first),
            f"last_{k}_mean": sum(last) / len(last)}


def one_teacher(work: Path, steps: int) -> dict:
    teacher_dir = work / "teacher_lowercase"
    started = time.monotonic()
    teacher = main_omni(teacher_dir, ["recipe=tiny_qwen3_grpo", "trainer.val_every=40", *VALIDATION,
                                      f"trainer.total_steps={40}"], work / "teacher_lowercase.log")
    teacher_model = teacher_dir / "model"
    before = sha256_of(teacher_model)
    student = main_omni(work / "student", ["recipe=tiny_qwen3_distill", f"trainer.total_steps={steps}",
                                           f"trainer.val_every={steps}", *VALIDATION,
                                           f"algo.family_options.teachers=[{{name: lowercase, path: '{teacher_model}'}}]"],
                        work / "student.log")
    after = sha256_of(teacher_model)
    n = len(HELD_OUT) * 16
    base, final, teach = val_at(student, 0), val_at(student, steps), val_at(teacher, 40)
    kl = curve(student, "distill/kl")
    rise = final["mean"] - base["mean"]
    rise_se = math.hypot(se(base, n), se(final, n))
    gap = teach["mean"] - final["mean"]
    return {
        "teacher": {"made_by": "python main_omni.py recipe=tiny_qwen3_grpo (GRPO, 40 steps, the lowercase reward)",
                    "val_reward": teach, "sha256_before": before, "sha256_after": after,
                    "unchanged": before == after},
        "student": {"recipe": "tiny_qwen3_distill", "steps": steps, "base_val_reward": base, "final_val_reward": final,
                    "val_samples": n, "rise": rise, "rise_se": rise_se, "rise_in_se": rise / rise_se,
                    "gap_to_teacher": gap, "gap_se": math.hypot(se(final, n), se(teach, n))},
        "distill_kl": ends(kl), "distill_kl_curve": kl,
        "train_reward_curve": curve(student, "reward/char_match/mean"),
        "timing_teacher_s_mean": sum(v for _, v in curve(student, "timing/teacher")) / len(kl),
        "seconds": round(time.monotonic() - started, 1),
    }


def two_teachers(work: Path, steps: int, lowercase_model: Path) -> dict:
    started = time.monotonic()
    main_omni(work / "teacher_digits", ["recipe=tiny_qwen3_grpo", f"reward.rewards={reward(DIGITS)}",
                                        "trainer.val_every=0"], work / "teacher_digits.log")
    models = {"lowercase": lowercase_model, "digits": work / "teacher_digits" / "model"}
    prompts = work / "two_sources.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "metadata": {"data_source": s}}) + "\n"
                               for s, ps in SOURCES.items() for p in ps))

    def teachers(swap: bool) -> str:
        other = {"lowercase": "digits", "digits": "lowercase"}
        return "[" + ", ".join(f"{{name: {name}, path: '{path}', data_source: {other[name] if swap else name}}}"
                               for name, path in models.items()) + "]"

    common = ["recipe=tiny_qwen3_distill", f"data.prompt_file={prompts}", "data.prompts=null", "data.val_prompts=null",
              f"reward.rewards={reward(LOWER + DIGITS, 0.0)}", "reward.val_rewards=null", "trainer.val_every=0"]
    student = main_omni(work / "student_two", [*common, f"trainer.total_steps={steps}",
                                               f"algo.family_options.teachers={teachers(False)}"],
                        work / "student_two.log")

    def matrix(model: str, tag: str) -> dict:
        """KL of each source's samples to each teacher: one step of all six prompts in one
        mini-batch, whose metrics are measured before its update (the learning rate, which must be
        > 0, is negligible anyway)."""
        out: dict = {source: {} for source in SOURCES}
        for swap in (False, True):
            records = main_omni(work / f"kl_{tag}_{'swapped' if swap else 'own'}", [
                *common, f"model.path='{model}'", "trainer.total_steps=1", "trainer.prompts_per_step=6",
                "trainer.samples_per_prompt=16", "trainer.mini_batch_size=96", "trainer.micro_batch_size=48",
                "optim.lr=1e-30", "trainer.save_every=0", f"algo.family_options.teachers={teachers(swap)}"],
                work / f"kl_{tag}_{'swapped' if swap else 'own'}.log")
            for name in models:
                source = name if not swap else {"lowercase": "digits", "digits": "lowercase"}[name]
                out[source][name] = records[0][f"distill/{name}/kl"]
        return out

    per_teacher = {name: curve(student, f"distill/{name}/kl") for name in models}
    return {
        "teachers": {"lowercase": "the one-teacher experiment's teacher",
                     "digits": "python main_omni.py recipe=tiny_qwen3_grpo with the reward counting digits (40 steps)"},
        "sources": SOURCES, "steps": steps,
        "distill_kl_per_teacher": {name: ends(c) for name, c in per_teacher.items()},
        "distill_kl_curves": per_teacher,
        "kl_matrix_base": matrix("tiny:qwen3", "base"),
        "kl_matrix_student": matrix(str(work / "student_two" / "model"), "student"),
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "token_distill.json"))
    parser.add_argument("--work", default=str(REPO / "outputs" / "bench_token_distill"))
    parser.add_argument("--steps", type=int, default=40, help="the one-teacher student's steps")
    parser.add_argument("--two-steps", type=int, default=80, help="the two-teacher student's steps")
    parser.add_argument("--reuse", action="store_true", help="read the finished runs in --work instead of running them")
    args = parser.parse_args()
    global REUSE
    REUSE = args.reuse
    work = Path(args.work)
    if work.exists() and any(work.iterdir()) and not args.reuse:
        sys.exit(f"error: --work {work} is not empty; give a new folder (the runs refuse a folder with a run)")
    work.mkdir(parents=True, exist_ok=True)
    import torch

    one = one_teacher(work, args.steps)
    two = two_teachers(work, args.two_steps, work / "teacher_lowercase" / "model")
    result = {
        "benchmark": "token_distill", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1")},
        "command": " ".join(["python", "benchmarks/token_distill.py", *sys.argv[1:]]),
        "one_teacher": one, "two_teachers": two,
    }
    atomic_write_json(Path(args.out), result)
    s, k = one["student"], one["distill_kl"]
    print(f"one teacher: distill/kl {k['first']:.3f} -> {k['last']:.4f}; held-out reward base "
          f"{s['base_val_reward']['mean']:.3f}, student {s['final_val_reward']['mean']:.3f}, teacher "
          f"{one['teacher']['val_reward']['mean']:.3f} (rise {s['rise']:.3f} = {s['rise_in_se']:.1f} SE); teacher "
          f"unchanged: {one['teacher']['unchanged']}")
    for tag in ("kl_matrix_base", "kl_matrix_student"):
        print(f"two teachers, {tag}: " + "; ".join(f"{src}: " + ", ".join(f"to {t} {v:.3f}" for t, v in row.items())
                                                 for src, row in two[tag].items()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

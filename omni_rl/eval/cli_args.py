"""The evaluation flags of `python main_omni.py`, taken out of the argument list before the config is composed.

`--eval BENCHMARK`, `--eval-model PATH`, `--eval-weights trained|ema`, `--eval-prompts PATH`,
`--eval-out DIR`, `--shard i/n`, `--eval-workers N`, `--protocol KEY=VALUE` (repeatable) and
`--compare A B` (no recipe needed); docs/evaluation.md explains each. A flag without its value,
or `--eval-*` without `--eval`, is one error naming it.
"""
from __future__ import annotations

from typing import Optional

from omni_rl.errors import OmniConfigError

_VALUED = ("--eval", "--eval-model", "--eval-prompts", "--eval-out", "--shard", "--protocol", "--eval-workers",
           "--eval-weights")
USAGE = """  --eval NAME   evaluate the recipe's model on benchmark NAME (geneval, ocr, pickscore, mmk12_greedy,
                mmk12_sampled, speech_wer_similarity, video_clip_consistency, geneval_shapes, ...): --eval-model PATH (checkpoint or LoRA; default the base), --eval-prompts PATH,
                --eval-out DIR, --shard i/n, --eval-workers N (Ray), --protocol KEY=VALUE; writes results.json
                (docs/evaluation.md)
  --compare A B compare two evaluation results: per-task deltas with 95% paired-bootstrap intervals"""


class EvalArgumentError(OmniConfigError):
    """An evaluation flag without its value, or one that needs `--eval`."""


def take_eval_args(args: list[str]):
    """(the other arguments, an `EvalRequest` or None, the two `--compare` paths or None)."""
    from omni_rl.eval.job import EvalRequest, parse_shard

    rest: list[str] = []
    values: dict[str, list[str]] = {}
    compare: Optional[tuple[str, str]] = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--compare":
            if len(args) - i < 3:
                raise EvalArgumentError("--compare takes two results (results.json files or their folders): --compare A B")
            compare = (args[i + 1], args[i + 2])
            i += 3
            continue
        if arg in _VALUED:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise EvalArgumentError(f"{arg} takes a value, e.g. {arg} {_EXAMPLES[arg]}")
            values.setdefault(arg, []).append(args[i + 1])
            i += 2
            continue
        rest.append(arg)
        i += 1
    for flag, given in values.items():
        if flag != "--protocol" and len(given) > 1:
            raise EvalArgumentError(f"{flag} given {len(given)} times ({', '.join(given)}); give it once")
    if "--eval" not in values:
        extra = sorted(values)
        if extra:
            raise EvalArgumentError(f"{extra[0]} needs --eval BENCHMARK (it sets how an evaluation runs)")
        return rest, None, compare
    one = {k: v[0] for k, v in values.items() if k != "--protocol"}
    request = EvalRequest(
        benchmark=one["--eval"], prompts=one.get("--eval-prompts"), model=one.get("--eval-model"),
        weights=one.get("--eval-weights", "trained"),
        shard=parse_shard(one["--shard"]) if "--shard" in one else (0, 1), out=one.get("--eval-out"),
        protocol=tuple(values.get("--protocol", ())), workers=_workers(one.get("--eval-workers")),
    )
    return rest, request, compare


def _workers(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise EvalArgumentError(f"--eval-workers {text!r}: expected an int >= 1 (Ray workers, one shard of the rows each)")
    return int(text)


_EXAMPLES = {"--eval-workers": "2", "--eval-weights": "ema", "--eval": "geneval", "--eval-model": "outputs/RUN/checkpoints/step_000030", "--eval-prompts": "FILE.jsonl",
             "--eval-out": "DIR", "--shard": "0/2", "--protocol": "num_steps=40"}

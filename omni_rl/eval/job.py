"""`run_eval`: one benchmark on one model, resumable and sharded; `python main_omni.py recipe=NAME --eval B`.

Inputs are checked before the model loads; this shard's unrecorded rows are sampled in chunks,
scored and recorded, and results.json is written once every row is in.
Not here: other rollout backends (native only), Ray shards (`ray_shards`).
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from omni_rl.errors import OmniConfigError
from omni_rl.eval import benchmarks as _builtin  # noqa: F401  (registers every built-in benchmark)
from omni_rl.eval.aggregate import figures
from omni_rl.eval.benchmark import BENCHMARKS, Benchmark
from omni_rl.eval.grids import write_grids
from omni_rl.models.checksums import sha256_of
from omni_rl.eval.model_source import ModelSource, identity, load_source, model_config_for, resolve_source
from omni_rl.eval.protocol import SAMPLING_FIELDS, Protocol
from omni_rl.eval.sampling import SAMPLERS, Sampler
from omni_rl.eval.store import done_rows, open_folder, read_records, write_record, write_results

log = logging.getLogger(__name__)


class EvalInputError(OmniConfigError):
    """A bad `--eval` input: benchmark, prompt file, shard, or a model of the wrong family."""


@dataclass(frozen=True)
class EvalRequest:
    """What the command line asked for."""

    benchmark: str
    prompts: Optional[str] = None
    model: Optional[str] = None
    weights: str = "trained"  # a checkpoint's trained tensors, or their EMA
    shard: tuple[int, int] = (0, 1)
    out: Optional[str] = None
    protocol: tuple[str, ...] = ()
    workers: Optional[int] = None  # Ray workers (`omni_rl.eval.ray_shards`); None: this process


def parse_shard(text: str) -> tuple[int, int]:
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = -1
    if not sep or n < 1 or not 0 <= i < n:
        raise EvalInputError(f"--shard {text!r}: expected i/n with 0 <= i < n, e.g. --shard 0/2")
    return i, n


@dataclass
class Prepared:
    """A checked evaluation, before any model loads."""

    benchmark: Benchmark
    protocol: Protocol
    items: list
    rows: list[int]
    source: ModelSource
    out: Path
    run: dict[str, Any]


def prepare(cfg, request: EvalRequest) -> Prepared:
    """Step 1 of the module docstring; raises a config error (exit 2) naming the bad input."""
    from omni_rl.models.registry import ADAPTERS, adapter_key
    from omni_rl.plugins import load_plugins

    from omni_rl.device import check_trainer_device
    from omni_rl.models.loading import check_model_source

    load_plugins(tuple(cfg.plugins))
    benchmark = BENCHMARKS.get(request.benchmark)
    family = ADAPTERS.get(adapter_key(cfg.model.adapter, cfg.model.stage)).family
    if family != benchmark.family:
        raise EvalInputError(f"--eval {benchmark.name}: it evaluates {benchmark.family} models, and recipe model "
                             f"{cfg.model.adapter} is a {family} model; pick a benchmark of its family "
                             f"({', '.join(n for n in BENCHMARKS.names() if BENCHMARKS.get(n).family == family)})")
    sampler = SAMPLERS.get(benchmark.family)
    protocol = benchmark.protocol.with_overrides(request.protocol)
    unread = [f for f in SAMPLING_FIELDS if getattr(protocol, f) is not None and f not in sampler.fields]
    if unread:
        raise EvalInputError(f"--eval {benchmark.name}: protocol field(s) {', '.join(unread)} are not read when "
                             f"sampling {benchmark.family} models (it reads {', '.join(sampler.fields)}); drop them")
    protocol = protocol.filled(sampler.recipe_values(cfg))
    _check_scored(benchmark, protocol, sampler.makes(protocol))
    path = _prompt_path(benchmark, request.prompts)
    _check_scorers(protocol)
    items, prompt_file = _read_prompts(benchmark, path, protocol)
    source = resolve_source(request.model, request.weights)
    check_trainer_device(cfg.trainer.device, "local")  # the job samples in this process
    check_model_source(cfg.model)  # a model path that holds no model, before minutes of loading
    shard_index, shard_count = request.shard
    rows = list(range(shard_index, len(items), shard_count))
    ident = identity(source, cfg)
    out = Path(request.out) if request.out else _default_out(cfg, benchmark, source, ident)
    run = {"benchmark": benchmark.name, "protocol": protocol.to_dict(), "model": ident, "prompt_file": prompt_file}
    open_folder(out, run)
    return Prepared(benchmark, protocol, items, rows, source, out, run)


def _check_scored(benchmark: Benchmark, protocol: Protocol, makes: frozenset[str]) -> None:
    """Each scorer scores what the samples are (an image scorer scores video through `video_frames`)."""
    from omni_rl.reward.registry import REWARDS, reward_modalities

    for scorer in protocol.scorers:
        REWARDS.get(scorer.reward)  # an unknown scorer names the registered ones
        scores = reward_modalities(scorer.reward, dict(scorer.kwargs))
        if scores & makes or ("image" in scores and "video" in makes and scorer.video_frames):
            continue
        raise EvalInputError(
            f"--eval {benchmark.name}: its scorer {scorer.reward!r} scores {' or '.join(sorted(scores))}, and the "
            f"recipe's model makes {' and '.join(sorted(makes))} under this protocol"
            + ("" if "image" not in makes else f" (num_frames={protocol.num_frames}: pick a video model's recipe)"))


def _check_scorers(protocol: Protocol) -> None:
    """Each scorer's options, and the files they name (a reference voice, a head's weights)."""
    from omni_rl.reward.registry import REWARDS, check_reward_files, check_reward_options

    for scorer in protocol.scorers:
        REWARDS.get(scorer.reward)  # an unknown scorer names the registered ones
        try:
            check_reward_options(scorer.reward, dict(scorer.kwargs))
            check_reward_files(scorer.reward, dict(scorer.kwargs))
        except (TypeError, ValueError) as err:
            raise EvalInputError(f"scorer {scorer.reward!r} of the protocol: {err} (set a scorer's option with "
                                 f"--protocol {scorer.reward}.OPTION=VALUE)") from None


def _prompt_path(benchmark: Benchmark, given: Optional[str]) -> str:
    from omni_rl.config.loader import PROJECT_ROOT

    path = given or (str(PROJECT_ROOT / benchmark.prompts.default) if benchmark.prompts.default else None)
    if path is None:
        raise EvalInputError(f"--eval {benchmark.name} needs its prompt file ({benchmark.prompts.format}); get "
                             f"{benchmark.prompts.get}, and pass --eval-prompts PATH")
    return path


def _read_prompts(benchmark: Benchmark, path: str, protocol: Protocol) -> tuple[list, dict]:
    from omni_rl.data.prompts import read_prompt_file
    from omni_rl.reward.inputs import RewardInputError
    from omni_rl.reward.registry import reward_prompt_check

    items = read_prompt_file(path, "--eval-prompts")
    if not items:
        raise EvalInputError(f"--eval-prompts {path!r} holds no prompts; expected {benchmark.prompts.format}")
    for scorer in protocol.scorers:
        check = reward_prompt_check(scorer.reward)
        if check is not None:
            try:
                check([i.prompt for i in items], [i.metadata for i in items])
            except RewardInputError as err:
                raise EvalInputError(f"--eval-prompts {path!r} is not a {benchmark.name} prompt file "
                                     f"({benchmark.prompts.format}): {err}") from None
    digest = sha256_of(Path(path))
    return items, {"path": path, "sha256": digest, "rows": len(items)}


def _default_out(cfg, benchmark: Benchmark, source: ModelSource, ident: dict) -> Path:
    """outputs/eval/<run name>/<model label>/<benchmark>, beside (never inside) the run's folder."""
    run_dir = Path(cfg.trainer.output_dir)
    label = "base"
    if source.path is not None:
        first = next(iter(ident["sha256"].values()), "")
        owner = source.path.parent if source.path.is_file() else source.path
        label = f"{owner.name}-{first[:8]}" + ("-ema" if source.weights == "ema" else "")
    return run_dir.parent / "eval" / run_dir.name / label / benchmark.name


def run_eval(cfg, request: EvalRequest, progress: bool = True) -> Optional[dict[str, Any]]:
    """Evaluate; the results (also in results.json) when every row is done, else None."""
    job = prepare(cfg, request)
    pending = sorted(set(job.rows) - done_rows(job.out))
    if pending:
        _sample_and_score(cfg, job, pending, progress)
    done = done_rows(job.out)
    missing = len(job.items) - len(done & set(range(len(job.items))))
    if missing:
        print(f"eval {job.benchmark.name}: shard {request.shard[0]}/{request.shard[1]} done ({len(job.rows)} rows); "
              f"{missing} of {len(job.items)} rows are other shards' (rerun without --shard once they finish to "
              f"write results.json)", file=sys.stderr)
        return None
    return _finish(cfg, job)


def _sample_and_score(cfg, job: Prepared, pending: list[int], progress: bool) -> None:
    from omni_rl.device import pick_device
    from omni_rl.models.factory import build_model
    from omni_rl.reward.manager import RewardManager

    torch.manual_seed(cfg.trainer.seed)
    model = build_model(model_config_for(job.source, cfg), pick_device(cfg.trainer.device), tuple(cfg.plugins))
    load_source(job.source, model, cfg)
    model.set_eval_mode()
    sampler = SAMPLERS.get(job.benchmark.family)(cfg, model, job.protocol)
    scorers = RewardManager([s.as_reward_spec() for s in job.protocol.scorers], plugins=tuple(cfg.plugins))
    per_chunk = max(1, cfg.rollout.max_num_seqs // job.protocol.samples_per_prompt)
    bar = _progress(len(pending), job.benchmark.name, progress)
    try:
        for start in range(0, len(pending), per_chunk):
            rows = pending[start:start + per_chunk]
            _chunk(job, sampler, scorers, rows)
            bar.update(len(rows))
    finally:
        bar.close()
        sampler.close()


def _chunk(job: Prepared, sampler: Sampler, scorers, rows: list[int]) -> None:
    """Draw, score and record `rows` (each with the protocol's samples per prompt)."""
    drawn = sampler.draw([(row, k, job.items[row]) for row in rows for k in range(job.protocol.samples_per_prompt)],
                         job.out)
    scored = scorers.score(drawn.samples, drawn.prompts, drawn.metadata)
    where = [(row, k) for row in rows for k in range(job.protocol.samples_per_prompt)]
    records: dict[int, dict] = {}
    for n, (row, k) in enumerate(where):
        values = {name: float(v[n]) for name, v in scored.per_reward.items()}
        details = {name: d[n] for name, d in scored.details.items()}
        record = records.setdefault(row, {"index": row, "prompt": job.items[row].prompt,
                                          "metadata": _jsonable(job.items[row].metadata), "samples": []})
        record["samples"].append({
            "sample": k, "seed": drawn.seeds[n], **_jsonable(drawn.keep[n]), "scores": values,
            "details": _jsonable(details), "metrics": {m.name: m.value(values, details) for m in job.benchmark.metrics}})
    for record in records.values():
        write_record(job.out, record)


def _finish(cfg, job: Prepared) -> dict[str, Any]:
    import omni_rl

    records = read_records(job.out, range(len(job.items)))
    figs = figures(job.benchmark, records)
    results = {
        **job.run,
        "omni_rl_version": omni_rl.__version__,
        "counts": {"prompts": len(records), "samples": sum(len(r["samples"]) for r in records)},
        "figures": figs,
        "headline": {"metric": job.benchmark.headline, "value": figs[job.benchmark.headline]["overall"]},
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    path = write_results(job.out, results)
    write_grids(job.out, job.benchmark, records)
    print(summary_table(job.benchmark, results))
    print(f"eval: results in {path}")
    return results


def summary_table(benchmark: Benchmark, results: dict[str, Any]) -> str:
    """The figures as a console table, with the protocol and the model under it."""
    figs = results["figures"]
    lines = [f"{benchmark.name}: {results['counts']['prompts']} prompts, {results['counts']['samples']} samples"]
    head = f"{'metric':<18} {'overall':>9} {'mean':>9} {'se':>8}"
    tasks = sorted({t for f in figs.values() for t in f.get("tasks", {})}, key=lambda t: (t not in benchmark.tasks, benchmark.tasks.index(t) if t in benchmark.tasks else 0, t))
    lines.append(head + "".join(f" {t[:12]:>12}" for t in tasks) + ("  prompts_any" if any("prompts_any" in f for f in figs.values()) else ""))
    for name, fig in figs.items():
        row = f"{name:<18} {fig['overall']:>9.4f} {fig['mean']:>9.4f} {fig['se']:>8.4f}"
        row += "".join(f" {fig['tasks'][t]['mean']:>12.4f}" if t in fig.get("tasks", {}) else f" {'':>12}" for t in tasks)
        if "prompts_any" in fig:
            row += f"  {fig['prompts_any']:.4f}"
        lines.append(row)
    p = results["protocol"]
    lines.append("protocol: " + ", ".join(f"{k}={v}" for k, v in p.items() if k != "scorers" and v is not None)
                 + "; scorers: " + ", ".join(f"{s['reward']}{s['kwargs'] or ''}" for s in p["scorers"]))
    lines.append(f"model: {results['model']}")
    return "\n".join(lines)


def _progress(total: int, name: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=f"eval {name}", unit="prompt", disable=not enabled, file=sys.stderr)


def _jsonable(value: Any) -> Any:
    """JSON-safe copy: tensors and arrays to lists, dataclasses to dicts, other objects to str."""
    import dataclasses as dc

    import numpy as np

    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if dc.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dc.asdict(value))
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)

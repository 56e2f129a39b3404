"""The PPO update loop, shared by the one-process actor group and every Ray rank.

Each epoch shuffles the samples (seeded by (seed, step, epoch), the same on every rank) into
mini-batches (one optimizer step) and micro-batches (one forward), with one backward per chunk;
rank r takes its share with the loss scaled to equal one process's update. `run_update` returns
device sums that ranks add up and `summarize` turns into metrics; the first mini-batch's
log-prob gap is kept as the rollout-vs-trainer gap (`actor/first_minibatch_logprob_abs_diff_*`).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from omni_rl.utils.seeding import derive_seed

FIRST_MINIBATCH_KEY = "actor/first_minibatch_ratio_max_abs_dev"
# Reported by the families' losses on every chunk (|stored old log-prob - this forward's|);
# meaningful only before the first update, so the update keeps them for the first mini-batch
# under FIRST_GAP_*_KEY and logs no other value of them. `rollout_corr/logprob_abs_diff_*` is the
# trainer's (`PPOTrainer.rollout_corr_metrics`), which reads these where it checked no sample itself.
GAP_MAX_KEY = "loss/logprob_abs_diff_max"
GAP_MEAN_KEY = "loss/logprob_abs_diff_mean"
FIRST_GAP_MAX_KEY = "actor/first_minibatch_logprob_abs_diff_max"
FIRST_GAP_MEAN_KEY = "actor/first_minibatch_logprob_abs_diff_mean"
# Metrics a family's loss reports in seconds (a teacher's forwards): the update's total, not a mean per chunk.
TIMING_PREFIX = "timing/"


def run_update(engine, family, batch, cfg, step: int, rank: int = 0, world: int = 1,
               after_optimizer_step: Optional[Callable[[], None]] = None) -> dict[str, Any]:
    t = cfg.trainer
    share = t.mini_batch_size // world
    num_chunks = family.num_chunks(batch)
    # What the loss trains: the samples, or what the family makes of them (preference pairs,
    # fewer than the samples and possibly none); mini- and micro-batches are of these items.
    batch = family.train_items(batch)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    maxima: dict[str, float] = {}
    num_updates = 0

    def record(metrics: dict[str, Any]) -> None:
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + wide(v)
            # A loss's seconds (timing/teacher) add up over the update; summarize averages the ranks'.
            counts[k] = 1 if k.startswith(TIMING_PREFIX) else counts.get(k, 0) + 1

    def keep_max(k: str, v) -> None:
        maxima[k] = larger(maxima.get(k, 0.0), v)

    for epoch in range(cfg.algo.ppo_epochs):
        order = torch.randperm(
            len(batch), generator=torch.Generator().manual_seed(derive_seed(t.seed, "shuffle", step, epoch))
        )
        for mb_start in range(0, len(batch), t.mini_batch_size):
            mine = order[mb_start : mb_start + t.mini_batch_size][rank * share : (rank + 1) * share]
            # Micro-batches in this share: share // micro_batch_size for samples (the config makes
            # them divide); fewer for a last, short mini-batch of items that do not.
            micro_per_share = -(-len(mine) // t.micro_batch_size)
            for mc_start in range(0, len(mine), t.micro_batch_size):
                micro = batch.select(mine[mc_start : mc_start + t.micro_batch_size])
                for j in range(num_chunks):
                    # One backward per chunk keeps one chunk's graph in memory.
                    m = engine.forward_backward(
                        micro, lambda mb, j=j: family.loss(mb, j), loss_scale=1.0 / (num_chunks * micro_per_share)
                    )
                    gap_max, gap_mean = m.pop(GAP_MAX_KEY, None), m.pop(GAP_MEAN_KEY, None)
                    if num_updates == 0 and gap_max is not None:
                        keep_max(FIRST_GAP_MAX_KEY, gap_max)
                        record({FIRST_GAP_MEAN_KEY: gap_mean})
                    record(m)
                    dev = m.get("loss/ratio_max_abs_dev", 0.0)
                    keep_max("loss/ratio_max_abs_dev", dev)
                    if num_updates == 0:
                        # Before the step's first optimizer update the policy is the behaviour
                        # policy: with recomputed old log-probs the ratio must be exactly 1.
                        keep_max(FIRST_MINIBATCH_KEY, dev)
            record(engine.optimizer_step())
            family.after_optimizer_step()
            if after_optimizer_step is not None:
                after_optimizer_step()
            num_updates += 1
    sums, maxima = on_host(sums), on_host(maxima)
    return {"sums": sums, "counts": counts, "maxima": maxima, "num_updates": num_updates}


def wide(v):
    """A metric in float64 where the device has it (CPU, CUDA), as the Python floats it replaced:
    float32 sums of many tiny loss terms lose digits."""
    if isinstance(v, torch.Tensor) and v.device.type in ("cpu", "cuda"):
        return v.to(torch.float64)
    return v


def larger(a, b):
    """max(a, b) for numbers and 0-dim tensors, without reading a tensor on the host."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.maximum(a, b.to(a.dtype))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        t, x = (a, b) if isinstance(a, torch.Tensor) else (b, a)
        return t.clamp(min=float(x))
    return max(a, b)


def on_host(values: dict[str, Any]) -> dict[str, float]:
    """Every value as a float; the tensors among them read in one host sync."""
    out = {k: float(v) for k, v in values.items() if not isinstance(v, torch.Tensor)}
    tensors = {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}
    if tensors:
        device = next(iter(tensors.values())).device
        dtype = torch.float64 if device.type in ("cpu", "cuda") else torch.float32
        read = torch.stack([v.detach().to(device, dtype).reshape(()) for v in tensors.values()]).tolist()
        out.update(zip(tensors, read))
    return {k: out[k] for k in values}


def summarize(parts: list[dict[str, Any]]) -> dict[str, float]:
    """Metrics of a step's update from the raw results of one or more ranks."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    maxima: dict[str, float] = {}
    for p in parts:
        for k, v in p["sums"].items():
            sums[k] = sums.get(k, 0.0) + v
            counts[k] = counts.get(k, 0) + p["counts"][k]
        for k, v in p["maxima"].items():
            maxima[k] = max(maxima.get(k, 0.0), v)
    out = {k: sums[k] / counts[k] for k in sums}
    out.update(maxima)
    out["actor/num_updates"] = float(parts[0]["num_updates"])
    return out

"""The PPO update loop, shared by the one-process trainer and every Ray rank.

For each epoch the step's samples are shuffled (seeded by (seed, step, epoch), so every rank
draws the same order), cut into mini-batches of `mini_batch_size` samples (one optimizer step
each), and each mini-batch into micro-batches of `micro_batch_size` (one forward each), with one
backward per chunk (a denoising step; a whole response). With `world` ranks, rank `r` takes the
r-th equal share of every mini-batch; the loss is scaled by 1 / (chunks x the rank's micro-batches
per mini-batch) and the engine averages gradients across ranks, so the update equals one process
on the whole mini-batch.

`run_update` returns raw sums, counts and maxima, which ranks add up; `summarize` turns them into
the step's metrics.
"""
from __future__ import annotations

from typing import Any

import torch

from omni_rl.utils.seeding import derive_seed

FIRST_MINIBATCH_KEY = "actor/first_minibatch_ratio_max_abs_dev"


def run_update(engine, actor, batch, cfg, step: int, rank: int = 0, world: int = 1) -> dict[str, Any]:
    t = cfg.trainer
    share = t.mini_batch_size // world
    micro_per_share = share // t.micro_batch_size
    num_chunks = actor.num_chunks(batch)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    maxima: dict[str, float] = {}
    num_updates = 0

    def record(metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + v
            counts[k] = counts.get(k, 0) + 1

    for epoch in range(cfg.algo.ppo_epochs):
        order = torch.randperm(
            len(batch), generator=torch.Generator().manual_seed(derive_seed(t.seed, "shuffle", step, epoch))
        )
        for mb_start in range(0, len(batch), t.mini_batch_size):
            mine = order[mb_start : mb_start + t.mini_batch_size][rank * share : (rank + 1) * share]
            for mc_start in range(0, len(mine), t.micro_batch_size):
                micro = batch.select(mine[mc_start : mc_start + t.micro_batch_size])
                for j in range(num_chunks):
                    # One backward per chunk keeps one chunk's graph in memory.
                    m = engine.forward_backward(
                        micro, lambda mb, j=j: actor.loss(mb, j), loss_scale=1.0 / (num_chunks * micro_per_share)
                    )
                    record(m)
                    dev = m.get("loss/ratio_max_abs_dev", 0.0)
                    maxima["loss/ratio_max_abs_dev"] = max(maxima.get("loss/ratio_max_abs_dev", 0.0), dev)
                    if num_updates == 0:
                        # Before the step's first optimizer update the policy is the behaviour
                        # policy: with recomputed old log-probs the ratio must be exactly 1.
                        maxima[FIRST_MINIBATCH_KEY] = max(maxima.get(FIRST_MINIBATCH_KEY, 0.0), dev)
            record(engine.optimizer_step())
            num_updates += 1
    return {"sums": sums, "counts": counts, "maxima": maxima, "num_updates": num_updates}


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

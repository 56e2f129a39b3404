"""The PPO update loop, shared by the one-process actor group and every Ray rank.

For each epoch the step's samples are shuffled (seeded by (seed, step, epoch), so every rank
draws the same order), cut into mini-batches of `mini_batch_size` samples (one optimizer step
each), and each mini-batch into micro-batches of `micro_batch_size` (one forward each), with one
backward per chunk (a denoising step; a whole response). With `world` ranks, rank `r` takes the
r-th equal share of every mini-batch; the loss is scaled by 1 / (chunks x the rank's micro-batches
per mini-batch) and the engine averages gradients across ranks, so the update equals one process
on the whole mini-batch.

`run_update` returns raw sums, counts and maxima, which ranks add up; `summarize` turns them into
the step's metrics. The gaps a family's loss reports (stored old log-probs vs this forward's,
`GAP_*_KEY`) are kept for the first mini-batch only, as `actor/first_minibatch_logprob_abs_diff_*`:
before the first optimizer step the policy is the behaviour policy, so with the rollout's
log-probs as the old ones they measure the rollout-vs-trainer gap on those samples, for free.

The family may train something other than the samples (`ModelFamily.train_items`: the
preference pairs of `diffusion_dpo`), and hears of every optimizer step
(`after_optimizer_step`: the EMA of `diffusion_nft`).
"""
from __future__ import annotations

from typing import Any

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


def run_update(engine, family, batch, cfg, step: int, rank: int = 0, world: int = 1) -> dict[str, Any]:
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
                        maxima[FIRST_GAP_MAX_KEY] = max(maxima.get(FIRST_GAP_MAX_KEY, 0.0), gap_max)
                        record({FIRST_GAP_MEAN_KEY: gap_mean})
                    record(m)
                    dev = m.get("loss/ratio_max_abs_dev", 0.0)
                    maxima["loss/ratio_max_abs_dev"] = max(maxima.get("loss/ratio_max_abs_dev", 0.0), dev)
                    if num_updates == 0:
                        # Before the step's first optimizer update the policy is the behaviour
                        # policy: with recomputed old log-probs the ratio must be exactly 1.
                        maxima[FIRST_MINIBATCH_KEY] = max(maxima.get(FIRST_MINIBATCH_KEY, 0.0), dev)
            record(engine.optimizer_step())
            family.after_optimizer_step()
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

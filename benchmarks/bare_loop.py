"""The floor under a training step: `tiny_sd3_flowgrpo`'s work as a plain torch loop.

The same model (the recipe's tiny SD3 with its LoRA, built by the adapter), the same requests
(prompts x samples, 6 steps, CFG 4.5, a 3-step SDE window per sample at noise level 0.7), the
same step kernel (`sde_step`), reward (brightness, or what `--override reward.*` sets), advantages (GRPO, global std), loss (the
clipped ratio of FlowGRPO) and optimizer (AdamW, the recipe's `optim.*`, gradient clipping), with
no trainer, engine, family, pipeline or reward scorer around them: one thread, one function.

Each step: one batched forward per denoising step over every sample (the native engine's batches
at `max_num_seqs` >= samples), one decode, the reward, then one epoch of mini-batches, each of
micro-batches, each with one forward and backward per trained window step (the trainer's
replay). It counts its forwards and checks them against those numbers.

It draws what the trainer draws from the same seed (`trainer.seed`): the step's prompts in the
order of the trainer's prompt sampler, each sample's seed (`derive_seed(seed, "train", step, i)`),
which draws its initial noise and then each step's, its SDE window, and the mini-batches' shuffle.
So its rewards are the trainer's (`tests/benchmarks/test_bare_loop.py` checks it).

It writes `metrics.jsonl` in the trainer's format (`timing/rollout`, `timing/reward`,
`timing/update`, `timing/step`, `reward/total/mean`, `reward/total/std`) so
`benchmarks/step_breakdown.py --bare` reads it like a run's. Only this recipe's work is written
here; other recipes are refused.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

from omni_rl.algos.flow_sde import sde_step
from omni_rl.algos.policy_losses import DIFFUSION_LOSSES
from omni_rl.compose import load_config
from omni_rl.models import build_model
from omni_rl.rollout.sde_window import choose_sde_window
from omni_rl.plugins import load_plugins
from omni_rl.reward.registry import build_reward
from omni_rl.utils.seeding import derive_seed

RECIPE = "tiny_sd3_flowgrpo"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default=RECIPE, help=f"only {RECIPE} (the loop is written for its work)")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--seed", type=int, default=None, help="the run seed (default: the recipe's trainer.seed, as the trainer's)")
    p.add_argument("--out", required=True, help="folder for metrics.jsonl")
    p.add_argument("--override", action="append", default=[],
                   help="reward.KEY=VALUE (repeatable): score with the recipe's reward changed as the trainer's arms "
                        "are, e.g. a reward model; only reward.* keys (the loop's other work is fixed)")
    args = p.parse_args(argv)
    for item in args.override:
        if not item.startswith("reward."):
            p.error(f"--override {item!r}: the bare loop takes only reward.* overrides; its other work is "
                    f"{RECIPE}'s as written")
    if args.recipe != RECIPE:
        p.error(f"--recipe={args.recipe!r}: the bare loop is written for {RECIPE} only")
    if args.steps < 1:
        p.error(f"--steps={args.steps}: expected >= 1")
    return args


def step_prompts(cfg, seed: int, step: int) -> list[str]:
    """Step `step`'s prompts (from 1), as the trainer's `PromptSampler` walks them:
    `prompts_per_step` at a time through the list, reshuffled each epoch from the seed."""
    items, per_step = cfg.data.prompts, cfg.trainer.prompts_per_step
    out = []
    for k in range((step - 1) * per_step, step * per_step):
        epoch, pos = divmod(k, len(items))
        order = list(range(len(items)))
        if cfg.data.shuffle:
            random.Random(f"prompts-{seed}-{epoch}").shuffle(order)
        out.append(items[order[pos]])
    return out


@torch.no_grad()
def rollout(model, cfg, prompts: list[str], seeds: list[int], counts: dict) -> dict:
    r = cfg.rollout.sampling_options
    n = len(prompts)
    # Each sample's generator draws its initial noise and then every step's (the engine's order).
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    shape = model.latent_shape(r.height, r.width)
    x = torch.stack([torch.randn(shape, generator=g) for g in gens])
    sigmas = model.sigmas(r.num_steps, r.height, r.width, r.num_frames)
    # Each distinct prompt encoded once, as the engine encodes them (a batch's shape changes its
    # float rounding), then one row per sample.
    unique = sorted(set(prompts))
    cond = model.encode_prompts(unique, negative_prompt=r.negative_prompt).select([unique.index(p) for p in prompts])
    windows = [choose_sde_window(s, r.num_steps, r.sde_window_size, tuple(r.sde_window_range)) for s in seeds]
    states, log_probs = [x], []
    for k in range(r.num_steps):
        v = model.predict_velocity(x, sigmas[k].expand(n), cond, r.guidance_scale)
        counts["rollout"] += 1
        level = torch.tensor([r.noise_level if a <= k < b else 0.0 for a, b in windows])
        out = sde_step(model_output=v, sigma=sigmas[k].expand(n), sigma_next=sigmas[k + 1].expand(n), sample=x,
                       noise_level=level, generator=gens)
        x = out.prev_sample
        states.append(x)
        log_probs.append(out.log_prob)
    states, log_probs = torch.stack(states, 1), torch.stack(log_probs, 1)  # [n, T+1, ...], [n, T]
    idx = torch.tensor([[a + j for j in range(b - a)] for a, b in windows])  # [n, W]
    rows = torch.arange(n)[:, None]
    return {
        "x": states[rows, idx], "x_next": states[rows, idx + 1], "old_log_prob": log_probs[rows, idx],
        "sigma": sigmas[idx], "sigma_next": sigmas[idx + 1],
        "level": torch.full(idx.shape, r.noise_level), "cond": cond, "images": model.decode(x),
    }


def update(model, optimizer, cfg, batch: dict, advantages: torch.Tensor, counts: dict, seed: int, step: int) -> None:
    t, o = cfg.trainer, cfg.algo.policy_loss_options["flow_grpo"]
    advantages = advantages.clamp(-o.adv_clip_max, o.adv_clip_max)
    n, w = batch["x"].shape[:2]
    params = model.trainable_parameters()
    for epoch in range(cfg.algo.ppo_epochs):
        # The samples shuffled into mini-batches, as the trainer shuffles them.
        order = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(seed, "shuffle", step, epoch)))
        for mb in range(0, n, t.mini_batch_size):
            mini = order[mb : mb + t.mini_batch_size]
            micro_starts = range(0, len(mini), t.micro_batch_size)
            for mc in micro_starts:
                rows = mini[mc : mc + t.micro_batch_size]
                cond = batch["cond"].select(rows)
                for j in range(w):
                    x, sigma = batch["x"][rows, j], batch["sigma"][rows, j]
                    v = model.predict_velocity(x, sigma, cond, cfg.rollout.sampling_options.guidance_scale)
                    counts["update"] += 1
                    out = sde_step(model_output=v, sigma=sigma, sigma_next=batch["sigma_next"][rows, j], sample=x,
                                   noise_level=batch["level"][rows, j], prev_sample=batch["x_next"][rows, j])
                    ratio = torch.exp(out.log_prob - batch["old_log_prob"][rows, j])
                    adv = advantages[rows]
                    loss = -torch.minimum(ratio * adv, ratio.clamp(1 - o.clip_low, 1 + o.clip_high) * adv).mean()
                    (loss / (len(micro_starts) * w)).backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def the_reward(cfg):
    """The recipe's one reward (brightness, unless `--override` names another), built by the
    registry as the trainer builds it; weighted as the recipe weights it."""
    items = cfg.reward.rewards
    if len(items) != 1:
        raise SystemExit(f"reward.rewards has {len(items)} items: the bare loop scores with exactly one")
    load_plugins(cfg.plugins)
    item = items[0]
    scorer = build_reward(item.name, **(item.reward_options or {}))

    def score(images, prompts, metas):
        return [item.weight * float(v) for v in scorer(images, prompts, metas)]

    return score


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = load_config([f"recipe={args.recipe}", *args.override])
    t, r = cfg.trainer, cfg.rollout
    seed = t.seed if args.seed is None else args.seed
    torch.manual_seed(seed)  # the LoRA's initial weights, as the trainer draws them
    model = build_model(cfg.model, torch.device("cpu"))
    params = model.trainable_parameters()
    o = cfg.optim
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay, eps=o.eps)
    score = the_reward(cfg)
    n = t.prompts_per_step * t.samples_per_prompt
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(1, args.steps + 1):
        counts = {"rollout": 0, "update": 0}
        prompts = [p for p in step_prompts(cfg, seed, step) for _ in range(t.samples_per_prompt)]
        seeds = [derive_seed(seed, "train", step, i) for i in range(n)]
        t0 = time.perf_counter()
        batch = rollout(model, cfg, prompts, seeds, counts)
        t1 = time.perf_counter()
        rewards = torch.tensor(score(batch["images"], prompts, [{} for _ in prompts]), dtype=torch.float32)
        groups = rewards.view(t.prompts_per_step, t.samples_per_prompt)
        # GRPO with the global population std (`algo.advantage_options`: std_mode global).
        eps = cfg.algo.advantage_options.eps
        advantages = ((groups - groups.mean(1, keepdim=True)) / (rewards.std(unbiased=False) + eps)).view(-1)
        t2 = time.perf_counter()
        update(model, optimizer, cfg, batch, advantages, counts, seed, step)
        t3 = time.perf_counter()
        windows = batch["x"].shape[1]
        want = {"rollout": r.sampling_options.num_steps * math.ceil(n / r.max_num_seqs),
                "update": cfg.algo.ppo_epochs * math.ceil(n / t.micro_batch_size) * windows}
        if counts != want:
            raise SystemExit(f"forward counts {counts} differ from the trainer's {want}: the loop is not the same work")
        lines.append(json.dumps({"step": step, "reward/total/mean": float(rewards.mean()),
                                 "reward/total/std": float(rewards.std(unbiased=False)),
                                 "timing/rollout": t1 - t0, "timing/reward": t2 - t1, "timing/update": t3 - t2,
                                 "timing/step": t3 - t0, "forwards/rollout": counts["rollout"],
                                 "forwards/update": counts["update"]}))
        print(lines[-1], flush=True)
    (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""Rollout-vs-trainer alignment of a mixture-of-experts model, without and with routing replay.

The tiny Qwen3-MoE of `recipes/tiny_qwen3_moe_grpo.yaml` in bf16 on the CPU: the native engine
samples the recipe's prompts (KV-cache decoding, `--rollout-batch` sequences per forward) with
its own copy of the weights, whose attention runs another kernel (`--rollout-attention`, eager;
the trainer's is transformers' default, sdpa), as a GPU rollout engine's does; the trainer
scores the same responses in its own batch shape (`--micro-batch` whole sequences per forward),
once per setting of `algo.family_options.routing_replay`:

- off: the trainer routes by itself;
- r2: the trainer's old-policy forward routes by itself and the update replays those routes;
- r3: every trainer forward replays the experts the rollout used.

Per setting, on the tokens whose route a scored log-prob depends on: the fraction whose
routing in the trainer's forward differs from the rollout's in at least one MoE layer; on the
response tokens: the gap between the rollout's log-probs and the trainer's old-policy ones
(mean and max |delta|, Pearson r); and the first mini-batch's importance ratio
exp(trainer - rollout) (mean, max |ratio - 1|), as with algo.old_logprob_mode=bypass before any
update. The same seeds and samples for every setting. It writes one JSON file.

Why another kernel: on a CPU the same kernel in bf16 gives the tiny model's routers bit-identical
inputs at both batch shapes (measured: no token's route differs), so without it there is nothing
for a replay to correct. What it leaves out: updates (the first mini-batch is scored before any step, where r2 routes as
off does: r2 differs from off only after the weights move within an update), and vLLM.
"""
from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from omni_rl.compose import load_config
from omni_rl.data.prompts import PromptItem
from omni_rl.data.text_batch import TextBatch
from omni_rl.families import build_family
from omni_rl.models import build_model
from omni_rl.models.moe_routing import differing_tokens, take_recorded
from omni_rl.plugins import load_plugins
from omni_rl.rollout.text_native import NativeTextEngine
from omni_rl.utils.seeding import derive_seed

RECIPE = "tiny_qwen3_moe_grpo"
SETTINGS = ("off", "r2", "r3")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bfloat16", help="model.dtype of rollout and trainer (bfloat16: the gap R3 closes)")
    p.add_argument("--prompts", type=int, default=6, help="prompts of the recipe (6 at most)")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--rollout-batch", type=int, default=4, help="sequences per rollout forward (rollout.max_num_seqs)")
    p.add_argument("--micro-batch", type=int, default=16, help="sequences per trainer forward")
    p.add_argument("--rollout-attention", default="eager",
                   help="attention kernel of the rollout's copy (transformers' attn_implementation: eager, sdpa)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/moe_alignment.json")
    return p.parse_args(argv)


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()).clamp(min=1e-300))


def measure(mode: str, args) -> dict:
    cfg = load_config([f"recipe={RECIPE}", f"model.dtype={args.dtype}", f"algo.family_options.routing_replay={mode}",
                       f"algo.family_options.max_new_tokens={args.max_new_tokens}", "algo.old_logprob_mode=recompute",
                       f"trainer.micro_batch_size={args.micro_batch}", f"trainer.seed={args.seed}"])
    model = build_model(cfg.model, torch.device("cpu"))
    family = build_family(cfg, model)
    sampler = build_model(cfg.model, torch.device("cpu"))  # the same weights, another attention kernel
    sampler.trainable_module().set_attn_implementation(args.rollout_attention)
    engine = NativeTextEngine(sampler, max_num_seqs=args.rollout_batch)
    items = [PromptItem(prompt=p) for p in cfg.data.prompts[: args.prompts]]
    requests, texts, metadata, groups = [], [], [], []
    for g, item in enumerate(items):
        for k in range(args.samples):
            # Routes recorded in every setting, to compare the trainer's with them.
            requests.append(family.request(item, derive_seed(args.seed, "train", 1, g * args.samples + k),
                                           record_routes=True))
            texts.append(item.prompt)
            metadata.append({})
            groups.append(g)
    results = engine.generate(requests)
    batch = TextBatch.from_results(results, texts, metadata, groups, model.pad_token_id)

    # The trainer's old-policy forward (micro-batches of its own shape), its routes recorded as used.
    old = family.behaviour_policy(batch, args.micro_batch)
    routing = model.routing
    used = []
    with torch.no_grad():
        for start in range(0, len(batch), args.micro_batch):
            micro = batch.select(range(start, min(start + args.micro_batch, len(batch))))
            with routing.recording() as layers:
                family.log_probs(micro)
            used.append(take_recorded(layers, len(micro)))
    used = torch.cat(used)
    needed = batch.route_mask.clone()
    last = needed.shape[1] - 1 - batch.attention_mask.flip(1).argmax(1)
    needed[torch.arange(len(batch)), last] = False  # the last token's route scores nothing
    differ = differing_tokens(used, batch.routes, needed)

    mask = batch.response_mask.bool()
    rollout, trainer = batch.rollout_log_probs[mask], old.log_probs[mask]
    delta = (trainer - rollout).abs()
    first = batch.select(range(min(cfg.trainer.mini_batch_size, len(batch))))
    with torch.no_grad():
        log_prob = family.log_probs(first)
    ratio = torch.exp(log_prob - first.rollout_log_probs)[first.response_mask.bool()]
    return {
        "routing_differs_fraction": float(differ.sum() / needed.sum()),
        "tokens_compared": int(needed.sum()),
        "logprob_abs_diff_mean": float(delta.mean()),
        "logprob_abs_diff_max": float(delta.max()),
        "logprob_pearson": pearson(rollout, trainer),
        "first_minibatch_ratio_mean": float(ratio.mean()),
        "first_minibatch_ratio_abs_dev_max": float((ratio - 1).abs().max()),
        "response_tokens": int(mask.sum()),
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    load_plugins([])
    torch.set_num_threads(1)
    out = {
        "recipe": RECIPE, "dtype": args.dtype, "prompts": args.prompts, "samples_per_prompt": args.samples,
        "max_new_tokens": args.max_new_tokens, "rollout_batch": args.rollout_batch, "micro_batch": args.micro_batch,
        "rollout_attention": args.rollout_attention, "trainer_attention": "sdpa", "seed": args.seed, "device": f"cpu ({platform.machine()})", "torch": torch.__version__,
        "settings": {mode: measure(mode, args) for mode in SETTINGS},
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

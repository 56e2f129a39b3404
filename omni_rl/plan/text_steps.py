"""The traced part of a text model's plan (`PlanSpec.modality == "text"`): decoding with the KV
cache and one training micro-batch, through the adapter's own `forward_logits`.

A text adapter's rollout and trainer both call `forward_logits` (fp32 logits over the whole
vocabulary), so the plan traces that method rather than the bare network: its logits are often
the largest tensor of a pass. It is traced as they call it: the prefill keeps the last
position's logits (`logits_to_keep=1`), the trainer the response's. Lengths come from the recipe:
P = `algo.family_options.max_prompt_tokens` (null: the model's context less the response),
R = `max_new_tokens`.

- rollout, one batch of `rollout.max_num_seqs` rows, the peak of two traced moments:
  - the prefill: P prompt tokens into an empty cache (the engine's first forward: logits of the
    last position only);
  - the last decoding step: one token into a cache of P + R - 1 tokens (the cache is filled
    untraced first; what the step holds at its end, the whole cache included, is its peak);
  FLOPs: the prefill's + R x the last step's (the last step attends over the longest cache: an
  upper bound of each step's);
- training: `trainer.micro_batch_size` rows of P + R tokens through `forward_logits` (logits
  of the R + 1 last positions, as `token_log_probs` asks), the token log-probs the trainer takes
  from them (log-softmax at the temperature, gathered), and backward
  of their mean, with the recipe's gradient checkpointing.

Media (images, audio) are planned as tokens of the prompt: their encoders' activations are not
traced. Prompts are token 0 everywhere: the cost of a dense decoder does not depend on the ids;
a MoE decoder's routing does (fake tensors route by shape: transformers' grouped experts).
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from omni_rl.plan.trace import LiveBytes, Trace, fake_mode, materialize

# Bytes a stored trajectory keeps per token: the id and its mask (int64), the old log-prob (fp32).
TRAJECTORY_BYTES_PER_TOKEN = 8 + 8 + 4


def text_lengths(cfg) -> tuple[int, int]:
    """(prompt tokens P, response tokens R) the plan traces at."""
    from omni_rl.families.base import prompt_limits

    response = int(cfg.algo.family_options.max_new_tokens)
    prompt = prompt_limits(cfg).max_prompt_tokens
    if prompt is None:
        from omni_rl.plan.weights import PlanBuildError

        raise PlanBuildError(
            "algo.family_options.max_prompt_tokens=None: the plan traces at the longest prompt, and null means the "
            "model's whole context; set algo.family_options.max_prompt_tokens to the recipe's prompt budget"
        )
    return int(prompt), response


def _storages(obj: Any, seen: set[int] | None = None) -> dict[int, int]:
    """{storage key: bytes} of every tensor reachable from a cache object (its attributes,
    lists, tuples and dicts)."""
    seen = set() if seen is None else seen
    out: dict[int, int] = {}
    if id(obj) in seen:
        return out
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        st = obj.untyped_storage()
        return {st._cdata: st.nbytes()}
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return out
    for item in items:
        out.update(_storages(item, seen))
    return out


def _ids(batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and a left-padded mask: the first row's first position is padding, as in a
    batch of prompts of different lengths. A mask of all ones would let transformers drop the
    mask on real tensors (a value test fake tensors cannot make) and take other attention
    kernels than a padded batch does."""
    mask = torch.ones(batch, length, dtype=torch.long)
    if length > 1:
        mask[0, 0] = 0
    return torch.zeros(batch, length, dtype=torch.long), mask


def trace_rollout(model, spec, batch: int, prompt: int, response: int) -> Trace:
    """Peak bytes and FLOPs of decoding one batch (module docstring); call in the model's mode."""
    positions = spec.text_positions or (lambda b, n: None)
    with torch.no_grad():
        live = LiveBytes(model.trainable_module())
        with live:
            ids, mask = _ids(batch, prompt)
            logits, _ = model.forward_logits(ids, mask, None, cache=model.new_cache(), position_ids=positions(batch, prompt),
                                             logits_to_keep=1)
            del logits
        prefill = live
        # The cache at its longest, filled outside the count.
        full = prompt + response - 1
        ids, mask = _ids(batch, full)
        logits, cache = model.forward_logits(ids, mask, None, cache=model.new_cache(), position_ids=positions(batch, full),
                                             logits_to_keep=1)
        del logits
        live = LiveBytes(model.trainable_module())
        with live:
            ids, mask = _ids(batch, full + 1)
            logits, cache = model.forward_logits(ids[:, -1:], mask, None, cache=cache)
            del logits
        # A cache updated in place was allocated before the count: add what the count did not see.
        unseen = sum(n for key, n in _storages(cache).items() if key not in live._held)
        last = live.peak + unseen
    return Trace(int(prefill.flops + response * live.flops), int(max(prefill.peak, last)))


def trace_train(model, spec, batch: int, prompt: int, response: int, temperature: float, checkpointing: bool) -> Trace:
    """Peak bytes and FLOPs of one micro-batch's forward and backward (module docstring)."""
    positions = spec.text_positions or (lambda b, n: None)
    module = model.trainable_module()
    module.train(checkpointing)
    live = LiveBytes(module)
    hooks = [p.register_post_accumulate_grad_hook(lambda p: live.not_activation(p.grad))
             for p in module.parameters() if p.requires_grad]
    try:
        with live:
            ids, mask = _ids(batch, prompt + response)
            logits, _ = model.forward_logits(ids, mask, None, position_ids=positions(batch, prompt + response),
                                             logits_to_keep=response + 1)
            logits = logits[:, :-1] / temperature
            log_probs = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, prompt:].unsqueeze(-1))
            log_probs.mean().backward()
            del logits, log_probs
    finally:
        for hook in hooks:
            hook.remove()
        module.eval()
    for p in module.parameters():
        p.grad = None
    return Trace(int(live.flops), int(live.peak))


def trace_text_step(model, spec, cfg, fake: bool = True, cache: dict | None = None):
    """`steps.StepTrace` of a text model: the rollout batch and the training micro-batch."""
    from omni_rl.plan.steps import StepTrace

    cache = {} if cache is None else cache
    prompt, response = text_lengths(cfg)
    temperature = float(cfg.algo.family_options.temperature)
    rollout_batch, train_batch = cfg.rollout.max_num_seqs, cfg.trainer.micro_batch_size
    mode_key = ("mode", id(model), fake)
    if mode_key not in cache:
        cache[mode_key] = fake_mode() if fake else contextlib.nullcontext()
        with cache[mode_key]:
            for module in model.trainable_modules().values():
                materialize(module, fake)
        # The trace runs on host tensors (fake or real); a weightless adapter's device is meta.
        model.device = torch.device("cpu")
    mode = cache[mode_key]
    roll_key = ("text-rollout", id(model), fake, rollout_batch, prompt, response)
    train_key = ("text-train", id(model), fake, train_batch, prompt, response, cfg.model.gradient_checkpointing)
    with mode:
        if roll_key not in cache:
            cache[roll_key] = trace_rollout(model, spec, rollout_batch, prompt, response)
        if train_key not in cache:
            cache[train_key] = trace_train(model, spec, train_batch, prompt, response, temperature,
                                           cfg.model.gradient_checkpointing)
    return StepTrace(cache[roll_key], cache[train_key], rollout_batch, train_batch, steps_per_sample=1)


def text_trajectory_bytes(cfg) -> int:
    """Bytes one sample's stored trajectory takes (TRAJECTORY_BYTES_PER_TOKEN per token)."""
    prompt, response = text_lengths(cfg)
    return (prompt + response) * TRAJECTORY_BYTES_PER_TOKEN

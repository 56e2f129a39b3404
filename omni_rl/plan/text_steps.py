"""The traced part of a text model's plan: decoding with the KV cache and one training micro-batch.

The plan traces `forward_logits`, as rollout and trainer call it (its fp32 logits are often a
pass's largest tensor): the rollout's peak is the larger of the prefill and the last decoding
step, its FLOPs the prefill plus R last steps (an upper bound); training is one micro-batch of
P + R tokens with its backward (docs/plan.md). Media are planned as prompt tokens; prompts are
token 0 (a MoE's routing would differ: fake tensors route by shape).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from omni_rl.plan.trace import LiveBytes, Trace, fake_mode, materialize

# Bytes a stored trajectory keeps per token: the id and its mask (int64), the old log-prob (fp32).
TRAJECTORY_BYTES_PER_TOKEN = 8 + 8 + 4


def text_lengths(cfg) -> tuple[int, int]:
    """(prompt tokens P, response tokens R) the plan traces at. An agent's response is its longest
    trajectory: every turn after the prompt, the model's and the tools' (agent.max_total_tokens),
    all in the KV cache at the last decoding step and in the update's forward."""
    from omni_rl.families.autoregressive import agent_options_of
    from omni_rl.families.base import prompt_limits

    agent = agent_options_of(cfg.algo.family_options)
    response = int(agent.max_total_tokens if agent is not None else cfg.rollout.sampling_options.max_new_tokens)
    prompt = prompt_limits(cfg).max_prompt_tokens
    if prompt is None:
        from omni_rl.plan.weights import PlanBuildError

        raise PlanBuildError(
            "algo.family_options.max_prompt_tokens=None: the plan traces at the longest prompt, and null means the "
            "model's whole context; set algo.family_options.max_prompt_tokens to the recipe's prompt budget"
        )
    return int(prompt), response


def agent_images(cfg, model) -> dict[str, Any] | None:
    """What an agent's tool images cost the longest trajectory, for a model that reads them
    (`takes_images`; None otherwise, or when no tool answers with images): per image-answering
    tool, its image size and tokens per image, the image tokens at one call a tool turn
    (agent.max_turns - 1 tool turns) and how many such images the trajectory's budget
    (agent.max_total_tokens, which the trace already covers) could hold at most."""
    from omni_rl.agent.components import TOOLS
    from omni_rl.families.autoregressive import agent_options_of

    agent = agent_options_of(cfg.algo.family_options)
    if agent is None or not model.takes_images:
        return None
    tools = []
    for item in agent.tools:
        size = TOOLS.get(item["name"]).image_size(item["tool_options"])
        if size is None:
            continue
        per_image = model.image_tokens(*size)
        turns = agent.max_turns - 1
        tools.append({"tool": item["name"], "height": size[0], "width": size[1], "tokens_per_image": per_image,
                      "images_one_call_a_turn": turns, "image_tokens_one_call_a_turn": turns * per_image,
                      "images_at_most": agent.max_total_tokens // per_image})
    return {"max_total_tokens": agent.max_total_tokens, "tools": tools} if tools else None


@dataclass(frozen=True)
class DecodeReads:
    """What one batch's decoding reads (`roofline.py` makes its memory time of it): the prefill's
    and one decoding step's parameter bytes as (dense, experts), and the KV cache at its longest."""

    batch: int
    prompt: int
    response: int
    prefill: tuple[int, int]
    step: tuple[int, int]
    cache_bytes: int  # P + R tokens a row, every layer's keys and values


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
        held = _storages(cache)
        unseen = sum(n for key, n in held.items() if key not in live._held)
        last = live.peak + unseen
    reads = DecodeReads(batch, prompt, response, (prefill.weight_read, prefill.expert_read),
                        (live.weight_read, live.expert_read), sum(held.values()))
    return Trace(int(prefill.flops + response * live.flops), int(max(prefill.peak, last)),
                 int(prefill.weight_read + response * live.weight_read),
                 int(prefill.expert_read + response * live.expert_read), decode=reads)


def response_log_probs(model, spec, batch: int, prompt: int, response: int, temperature: float) -> torch.Tensor:
    """What the trainer (and a text teacher) computes on a micro-batch of fake ids: the response
    positions' logits, tempered, their log-softmax and the sampled tokens' entries."""
    positions = spec.text_positions or (lambda b, n: None)
    ids, mask = _ids(batch, prompt + response)
    logits, _ = model.forward_logits(ids, mask, None, position_ids=positions(batch, prompt + response),
                                     logits_to_keep=response + 1)
    logits = logits[:, :-1] / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, prompt:].unsqueeze(-1))


def trace_train(model, spec, batch: int, prompt: int, response: int, temperature: float, checkpointing: bool) -> Trace:
    """Peak bytes and FLOPs of one micro-batch's forward and backward (module docstring)."""
    module = model.trainable_module()
    module.train(checkpointing)
    live = LiveBytes(module)
    hooks = [p.register_post_accumulate_grad_hook(lambda p: live.not_activation(p.grad))
             for p in module.parameters() if p.requires_grad]
    try:
        with live:
            log_probs = response_log_probs(model, spec, batch, prompt, response, temperature)
            log_probs.mean().backward()
            del log_probs
    finally:
        for hook in hooks:
            hook.remove()
        module.eval()
    for p in module.parameters():
        p.grad = None
    return Trace(int(live.flops), int(live.peak), int(live.weight_read), int(live.expert_read))


def trace_text_step(model, spec, cfg, fake: bool = True, cache: dict | None = None):
    """`steps.StepTrace` of a text model: the rollout batch and the training micro-batch."""
    from omni_rl.plan.steps import StepTrace

    cache = {} if cache is None else cache
    prompt, response = text_lengths(cfg)
    temperature = float(cfg.rollout.sampling_options.temperature)
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


def text_trajectory_bytes(cfg, model=None) -> int:
    """Bytes one sample's stored trajectory takes (TRAJECTORY_BYTES_PER_TOKEN per token), with
    its recorded routes where `model` (the plan's build) records them (`recorded_route_bytes`)."""
    prompt, response = text_lengths(cfg)
    routes = 0 if model is None else recorded_route_bytes(cfg, model)
    return (prompt + response) * TRAJECTORY_BYTES_PER_TOKEN + routes


def recorded_route_bytes(cfg, model) -> int:
    """Bytes of one sample's recorded routes under algo.family_options.routing_replay=r3: every
    token x MoE layers x top_k, in the smallest integer type of the expert count
    (`omni_rl.models.moe_routing`); 0 for a dense model or another setting."""
    from omni_rl.families.autoregressive import TextOptions
    from omni_rl.models.moe_routing import layout_of

    options = cfg.algo.family_options
    routers = model.router_modules() if isinstance(options, TextOptions) and options.routing_replay == "r3" else []
    if not routers:
        return 0
    layout = layout_of(routers)
    prompt, response = text_lengths(cfg)
    return (prompt + response) * layout.num_layers * layout.top_k * layout.dtype.itemsize

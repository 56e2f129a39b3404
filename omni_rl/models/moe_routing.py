"""Routed experts of a mixture-of-experts language model: recorded at rollout, replayed in training.

Rollout routing replay (R3, arXiv 2510.11370): the rollout records each token's experts per MoE
layer, and the trainer's forward uses those in place of its own top-k, so a token whose choice
would flip on another kernel is trained under the function that sampled it. The gate weights
stay the trainer's own (softmax of its router logits at the replayed experts), so the router
keeps its gradient. `RouterHooks` does this with forward hooks on the model's own routers;
`load_balancing_loss` counts the routes the forward used. Rationale: docs/algorithms.md.

Not here: which modules are the routers (the adapter says: `AutoregressiveModelBase.router_modules`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch

from omni_rl.errors import OmniRunError


class RoutingReplayError(OmniRunError):
    """A recording that does not fit the model or the forward it is replayed in (one `error:` line)."""


def route_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer type that holds expert indices 0 .. num_experts - 1."""
    if num_experts <= 256:
        return torch.uint8
    if num_experts <= 2**15:
        return torch.int16
    return torch.int32


@dataclass(frozen=True)
class RouterLayout:
    """What a recording of this model must match: MoE layers, experts per layer, experts per token."""

    num_layers: int
    num_experts: int
    top_k: int
    norm_topk_prob: bool

    @property
    def dtype(self) -> torch.dtype:
        return route_dtype(self.num_experts)

    def check(self, routes: torch.Tensor, what: str) -> None:
        """`routes` [..., layers, top_k] fit this model; else one error naming `what` (the sample)."""
        if routes.dim() < 2 or tuple(routes.shape[-2:]) != (self.num_layers, self.top_k):
            raise RoutingReplayError(
                f"{what}: routes of shape {tuple(routes.shape)}, expected [tokens, {self.num_layers} MoE layers, "
                f"top_k {self.top_k}]; the recording comes from another model than the one trained (same "
                f"model.path for the rollout and the trainer)")
        if routes.numel() and (int(routes.min()) < 0 or int(routes.max()) >= self.num_experts):
            bad = int(routes.max()) if int(routes.max()) >= self.num_experts else int(routes.min())
            raise RoutingReplayError(
                f"{what}: expert index {bad} in the routes, expected 0 .. {self.num_experts - 1} (the model has "
                f"{self.num_experts} experts); the recording comes from another model than the one trained")


def replayed_gate(router_logits: torch.Tensor, indices: torch.Tensor, norm_topk_prob: bool) -> torch.Tensor:
    """Gate weights [N, k] of `indices` [N, k]: softmax over all experts of the logits [N, E]
    (fp32), gathered at the indices, renormalised over them when `norm_topk_prob`, in the logits'
    dtype; transformers' Qwen3-MoE router weighs its own top-k exactly so."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float)
    weights = probs.gather(-1, indices)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype)


def load_balancing_loss(router_logits: Sequence[torch.Tensor], routes: Sequence[torch.Tensor],
                        token_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Switch-Transformer load balancing, E * sum_e f_e * P_e averaged over layers, with f_e the
    share of routed slots that went to expert e under `routes` (the routes the forward used: the
    replayed ones under replay) and P_e the mean router probability of e.

    router_logits: per layer [N, E]; routes: per layer [N, k] (long); token_mask [N] (1: counts)."""
    losses = []
    for logits, chosen in zip(router_logits, routes):
        n, experts = logits.shape
        mask = torch.ones(n, device=logits.device) if token_mask is None else token_mask.to(logits.device).float()
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        counts = torch.zeros(n, experts, device=logits.device).scatter_add_(
            1, chosen.long().to(logits.device), torch.ones(chosen.shape, device=logits.device))
        slots = (mask.sum() * chosen.shape[-1]).clamp(min=1)
        share = (counts * mask[:, None]).sum(0) / slots
        mean_prob = (probs * mask[:, None]).sum(0) / mask.sum().clamp(min=1)
        losses.append(experts * (share * mean_prob).sum())
    return torch.stack(losses).mean()


def layout_of(routers: Sequence[torch.nn.Module]) -> RouterLayout:
    """The layout of a model from its routers (transformers' Qwen3-MoE kind: `num_experts`,
    `top_k`, `norm_topk_prob`), one per MoE layer."""
    first = routers[0]
    return RouterLayout(len(routers), int(first.num_experts), int(first.top_k), bool(first.norm_topk_prob))


class RouterHooks:
    """Forward hooks on a model's routers (one per MoE layer, in layer order) that record the
    experts used and replay given ones.

    A replay is set (`set_replay`) and stays set until replaced or cleared: under activation
    checkpointing the backward recomputes the forward after the loss's call has returned, and
    must route as the forward did. A forward the replay does not fit (another token count) is
    refused. `recording()` keeps the routes each forward used (the replayed ones under a replay);
    a rollout engine clears the replay first, as it routes by itself.

    The state is the object's, not a thread's: autograd may recompute a checkpointed forward
    on a thread of its own (CUDA), which must see the replay."""

    def __init__(self, routers: Sequence[torch.nn.Module]):
        if not routers:
            raise ValueError("no routers: RouterHooks is for a mixture-of-experts model")
        self.layout = layout_of(routers)
        self._replay: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self._record: Optional[list[list[torch.Tensor]]] = None
        self._handles = [r.register_forward_hook(self._hook_for(i)) for i, r in enumerate(routers)]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def set_replay(self, routes: Optional[torch.Tensor], mask: Optional[torch.Tensor] = None) -> None:
        """Replay `routes` [layers, N, k] (N: the forward's tokens, batch-major) where `mask` [N]
        is true (elsewhere the router's own top-k); None clears."""
        if routes is None:
            self._replay = None
            return
        self.layout.check(routes.transpose(0, 1), "routing replay")
        n = routes.shape[1]
        mask = torch.ones(n, dtype=torch.bool) if mask is None else mask.bool()
        if mask.shape != (n,):
            raise RoutingReplayError(f"routing replay: mask of shape {tuple(mask.shape)}, expected [{n}]")
        self._replay = (routes.long(), mask)

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[list[torch.Tensor]]]:
        """Within the block every forward's routes are kept: `layers[l]` lists layer l's
        indices [N, k] (long), one entry per forward."""
        self._record = [[] for _ in range(self.layout.num_layers)]
        try:
            yield self._record
        finally:
            self._record = None

    @contextlib.contextmanager
    def replaying(self, routes: Optional[torch.Tensor], mask: Optional[torch.Tensor] = None) -> Iterator[None]:
        """`set_replay` within the block only (forwards with no backward after the block)."""
        saved = self._replay
        self.set_replay(routes, mask)
        try:
            yield
        finally:
            self._replay = saved

    def _hook_for(self, layer: int):
        def hook(module, inputs, output):
            logits, weights, indices = output
            if self._replay is not None:
                routes, mask = self._replay
                if routes.shape[1] != logits.shape[0]:
                    raise RoutingReplayError(
                        f"routing replay: routes for {routes.shape[1]} tokens, but MoE layer {layer}'s forward has "
                        f"{logits.shape[0]}; the replay was set for another batch")
                replay = routes[layer].to(indices.device)
                indices = torch.where(mask.to(indices.device)[:, None], replay, indices)
                weights = replayed_gate(logits, indices, self.layout.norm_topk_prob)
            if self._record is not None:
                self._record[layer].append(indices.detach())
            return logits, weights, indices
        return hook


def take_recorded(layers: list[list[torch.Tensor]], batch: int) -> torch.Tensor:
    """The last forward's routes [B, T, layers, k] from a recording (its N = B * T tokens)."""
    last = torch.stack([entries[-1] for entries in layers])  # [L, N, k]
    for entries in layers:
        entries.clear()
    n_layers, n, k = last.shape
    return last.reshape(n_layers, batch, n // batch, k).permute(1, 2, 0, 3)


def differing_tokens(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per token, whether two routings [..., L, k] differ in at least one layer (as sets of
    experts: the order of a top-k is not part of the route), where `mask` [...] is true."""
    return (a.long().sort(-1).values != b.long().sort(-1).values).any(-1).any(-1) & mask.bool()

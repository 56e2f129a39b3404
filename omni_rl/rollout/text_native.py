"""The native text rollout engine: batched sampling with per-request settings and seeds.

Requests sharing a batch key are decoded together (up to `max_num_seqs`, left-padded), each row
with its own temperature, top-p and generator. The recorded log-prob is the trainer's:
`log_softmax(logits / temperature)` in fp32 over the full tempered distribution; temperature 0
is greedy (evaluation only). Uses a KV cache where the model has one, and records a MoE model's
routed experts for requests that ask. `generate_turns` samples an agent's multi-turn
trajectories on the same cache (`text_turns`). The fast path on GPUs is `vllm`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from omni_rl.models.autoregressive import AutoregressiveModelBase, positions_from_mask
from omni_rl.models.moe_routing import take_recorded
from omni_rl.rollout.base import SynchronousRolloutEngine, check_weight_kind
from omni_rl.rollout.text_turns import TurnHandler, decode_turns
from omni_rl.rollout.text_sampling import collate_media, draw_token, left_pad
from omni_rl.rollout.text_types import TextRequest, TextResult
from omni_rl.utils.tensor_buckets import NamedTensors, named_buckets


class NativeTextEngine(SynchronousRolloutEngine):
    def __init__(self, model: AutoregressiveModelBase, max_num_seqs: int = 64):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs}: expected >= 1")
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.weight_version = 0
        self.stats = {"forwards": 0, "samples": 0}

    def generate(self, requests: Sequence[TextRequest], timeout_s: float | None = None) -> list[TextResult]:
        """Sample every request; results in request order."""
        for req in requests:
            if req.max_new_tokens < 1 or not req.temperature >= 0 or not 0 < req.top_p <= 1:
                raise ValueError(
                    f"request {req.request_id}: max_new_tokens={req.max_new_tokens}, temperature={req.temperature}, "
                    f"top_p={req.top_p}; expected max_new_tokens >= 1, temperature >= 0 (0: greedy), 0 < top_p <= 1"
                )
        results: dict[int, TextResult] = {}
        groups: dict[tuple, list[TextRequest]] = {}
        for req in requests:
            groups.setdefault(req.batch_key(), []).append(req)
        for group in groups.values():
            for start in range(0, len(group), self.max_num_seqs):
                for res in self._generate_batch(group[start : start + self.max_num_seqs]):
                    results[res.request_id] = res
        return [results[req.request_id] for req in requests]

    def generate_turns(self, requests: Sequence[TextRequest], handler: TurnHandler, max_total_tokens: int) -> list[TextResult]:
        """Sample multi-turn trajectories (one request each, `text_turns.decode_turns`): up to
        `max_num_seqs` share each forward whatever turn they are at; results in request order."""
        if any(r.record_routes for r in requests):
            raise ValueError("generate_turns records no routed experts; set algo.family_options.routing_replay=off")
        if self.model.routing is not None:
            self.model.routing.set_replay(None)
        results: dict[int, TextResult] = {}
        groups: dict[tuple, list[TextRequest]] = {}
        for req in requests:
            groups.setdefault(req.batch_key(), []).append(req)
        with torch.no_grad():
            for group in groups.values():
                for start in range(0, len(group), self.max_num_seqs):
                    for res in decode_turns(self.model, group[start : start + self.max_num_seqs], handler,
                                            max_total_tokens, self.weight_version,
                                            self.stats):
                        results[res.request_id] = res
        return [results[req.request_id] for req in requests]

    def shares_model_with(self, model) -> bool:
        return model is self.model  # it samples with the adapter it was built on

    def same_log_probs_as(self, model) -> bool:
        # Decoding token by token with a KV cache sums in another order than the trainer's
        # whole-sequence forward: close, not equal, so the trainer recomputes the old log-probs.
        return False

    def update_weights(self, tensors: NamedTensors, version: int, kind: str) -> None:
        # Between two generate calls: this engine samples synchronously in its caller's thread.
        check_weight_kind(kind)
        for bucket in named_buckets(tensors, 512 << 20):
            self.model.load_named_tensors(bucket)
        self.weight_version = version

    def close(self) -> None:
        pass

    @torch.no_grad()
    def _generate_batch(self, batch: list[TextRequest]) -> list[TextResult]:
        routing = self.model.routing
        if routing is None:
            return self._decode(batch, None)
        # The trainer's replay may still be set on a model this engine shares: sampling routes by itself.
        routing.set_replay(None)
        if not any(r.record_routes for r in batch):
            return self._decode(batch, None)
        with routing.recording() as layers:
            return self._decode(batch, layers)

    def _decode(self, batch: list[TextRequest], layers: Optional[list]) -> list[TextResult]:
        model = self.model
        n = len(batch)
        ids, mask = left_pad([r.prompt.input_ids for r in batch], model.pad_token_id)
        media = collate_media([r.prompt.media for r in batch])
        generators = [torch.Generator().manual_seed(r.seed) for r in batch]
        stops = [set(model.eos_token_ids) | set(r.stop_token_ids) for r in batch]
        max_new = max(r.max_new_tokens for r in batch)
        tokens: list[list[int]] = [[] for _ in range(n)]
        log_probs: list[list[float]] = [[] for _ in range(n)]
        done = [False] * n
        finish = ["length"] * n

        use_cache = model.supports_kv_cache
        cache = model.new_cache() if use_cache else None
        # Only the last position's logits are sampled from: a prefill never holds the prompt's.
        logits, cache = model.forward_logits(ids, mask, media, cache=cache, logits_to_keep=1)
        self.stats["forwards"] += 1
        last = logits[:, -1]
        # Per sample, the routes of each token fed: the prompt's now, each response token's at
        # the forward that feeds it (the last column of that forward).
        routes: list[list[torch.Tensor]] = [[] for _ in range(n)]
        if layers is not None:
            prefill = take_recorded(layers, n)
            for i, req in enumerate(batch):
                routes[i].append(prefill[i, prefill.shape[1] - len(req.prompt.input_ids):])
        for _ in range(max_new):
            new = torch.full((n, 1), model.pad_token_id, dtype=torch.long)
            new_mask = torch.zeros((n, 1), dtype=torch.long)
            for i, req in enumerate(batch):
                if done[i]:
                    continue
                token, log_prob = draw_token(last[i], req, generators[i])
                tokens[i].append(token)
                log_probs[i].append(log_prob)
                new[i, 0], new_mask[i, 0] = token, 1
                if token in stops[i]:
                    done[i], finish[i] = True, "stop"
                elif len(tokens[i]) >= req.max_new_tokens:
                    done[i] = True
            if all(done):
                break
            ids, mask = torch.cat([ids, new], 1), torch.cat([mask, new_mask], 1)
            if use_cache:
                logits, cache = model.forward_logits(
                    new, mask, media=None, cache=cache, position_ids=positions_from_mask(mask)[:, -1:]
                )
            else:
                logits, _ = model.forward_logits(ids, mask, media, logits_to_keep=1)
            self.stats["forwards"] += 1
            last = logits[:, -1]
            if layers is not None:
                fed = take_recorded(layers, n)[:, -1]
                for i in new_mask[:, 0].nonzero()[:, 0].tolist():
                    routes[i].append(fed[i : i + 1])
        self.stats["samples"] += n
        dtype = model.routing.layout.dtype if layers is not None else None
        return [
            TextResult(
                request_id=req.request_id,
                prompt=req.prompt,
                response_ids=torch.tensor(tokens[i], dtype=torch.long),
                log_probs=torch.tensor(log_probs[i], dtype=torch.float32),
                finish_reason=finish[i],
                text=model.decode_tokens(tokens[i]),
                temperature=req.temperature,
                top_p=req.top_p,
                weight_version=self.weight_version,
                routes=torch.cat(routes[i]).to(dtype).cpu() if layers is not None and req.record_routes else None,
            )
            for i, req in enumerate(batch)
        ]

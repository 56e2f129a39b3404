"""The vLLM worker extension of the `vllm` text backend (loaded by name in vLLM's workers only).

Imports torch and safetensors at import, vLLM's MoE layer classes where routes are captured.
`omni_rl_load_weights` receives a full-weight update through `LLM.collective_rpc` one safetensors
bucket at a time and at the last one reloads in place (`model_runner.reload_weights`), then
re-ties a tied `lm_head`. LoRA updates are `LoRARequest`s.

Routed experts: `omni_rl_moe_layers` names the decoder layers that route (vLLM's own
`enable_return_routed_experts` returns every decoder layer's row). Where vLLM cannot return them
(its V1 model runner: vLLM's CPU build without Triton's CPU backend), `omni_rl_capture_routes`
hands each MoE router a capture callback (the routers' own `set_capture_fn`, as vLLM's V2 runner
does), which files each forward's expert ids under the request and position the V1 runner
scheduled them at, and `omni_rl_take_routes` returns them per request. Left out: the V2 runner's
state (there vLLM returns routes itself), data/pipeline parallel ranks (one worker's rows).
"""
from __future__ import annotations

from functools import partial

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors


def retie_lm_head(model: torch.nn.Module) -> bool:
    """Point a tied `lm_head` at the input embedding's weights again and rerun its post-load
    processing (a CPU backend's packed copy of them). Returns whether the model ties them."""
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    # vLLM's causal LMs keep the embedding at `model.embed_tokens`; some have the accessor.
    inner = getattr(model, "model", None)
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else getattr(inner, "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embedding is None:
        return False
    if head.weight is not embedding.weight:
        head.weight = embedding.weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
    return True


class OmniRLVllmWorkerExtension:
    def omni_rl_load_weights(self, blob: bytes, last: bool) -> int:
        """Take one bucket (safetensors bytes); at the `last` one, load every bucket taken since
        the previous load into the model. Returns how many tensors were loaded (0 until the last)."""
        pending = self.__dict__.setdefault("_omni_rl_pending", [])
        pending.append(blob)
        if not last:
            return 0
        self._omni_rl_pending = []
        tensors: dict[str, torch.Tensor] = {}
        for part in pending:
            tensors.update(load_safetensors(part))
        model = self.model_runner.get_model()
        device = next(model.parameters()).device
        self.model_runner.reload_weights(weights_iterator=[(name, t.to(device)) for name, t in tensors.items()],
                                         is_checkpoint_format=True)
        retie_lm_head(model)
        return len(tensors)

    def omni_rl_moe_layers(self) -> list[int]:
        """The decoder-layer indices of the model's MoE layers, ascending."""
        from vllm.model_executor.layers.fused_moe.layer import MoERunner

        return sorted({int(m.layer_id) for m in self.model_runner.get_model().modules() if isinstance(m, MoERunner)})

    def omni_rl_capture_routes(self) -> list[int]:
        """Capture every MoE router's expert ids from now on (V1 model runner); returns the MoE
        layers bound, ascending."""
        from vllm.model_executor.layers.fused_moe.layer import MoERunner
        from vllm.model_executor.layers.fused_moe.router.fused_moe_router import FusedMoERouter

        # internal request id -> layer -> list of (positions [n], expert ids [n, k]) per forward
        self._omni_rl_routes: dict[str, dict[int, list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        bound = []
        for module in self.model_runner.get_model().modules():
            if isinstance(module, MoERunner):
                if not isinstance(module.router, FusedMoERouter):
                    raise RuntimeError(f"MoE layer {module.layer_id}: router {type(module.router).__name__} takes no "
                                       f"capture callback; routed experts cannot be recorded with this model in vLLM")
                module.router.set_capture_fn(partial(self._omni_rl_capture, int(module.layer_id)))
                bound.append(int(module.layer_id))
        self._omni_rl_layers = sorted(bound)
        return self._omni_rl_layers

    def _omni_rl_capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        """Called inside the forward, when the V1 runner's step buffers (which request and position
        each row of the batch is) still describe this forward."""
        runner = self.model_runner
        num_reqs = runner.input_batch.num_reqs
        # The scheduled tokens are the first rows of the forward; the rest is padding.
        total = int(runner.query_start_loc.np[num_reqs]) if num_reqs else 0
        if total == 0:
            return
        ids = topk_ids[:total].to("cpu", torch.int32)
        positions = runner.positions[:total].to("cpu")
        owners = torch.from_numpy(runner.req_indices.np[:total].copy())
        req_ids = runner.input_batch.req_ids
        for index in owners.unique().tolist():
            rows = owners == index
            per_layer = self._omni_rl_routes.setdefault(req_ids[index], {})
            per_layer.setdefault(layer, []).append((positions[rows], ids[rows]))

    def omni_rl_take_routes(self) -> bytes:
        """Every captured request's routes as safetensors bytes: `<internal id>` -> [S, layers, k]
        int32 rows of positions 0 .. S - 1 (-1 where a layer recorded no row), then forgets them."""
        captured, self._omni_rl_routes = self.__dict__.get("_omni_rl_routes", {}), {}
        layers = self.__dict__.get("_omni_rl_layers", [])
        out = {}
        for req_id, per_layer in captured.items():
            length = 1 + max(int(p.max()) for parts in per_layer.values() for p, _ in parts)
            k = next(iter(per_layer.values()))[0][1].shape[1]
            routes = torch.full((length, len(layers), k), -1, dtype=torch.int32)
            for j, layer in enumerate(layers):
                for positions, ids in per_layer.get(layer, []):  # a recomputed position (preemption) keeps the last
                    routes[positions, j] = ids
            out[req_id] = routes
        return save_safetensors(out)

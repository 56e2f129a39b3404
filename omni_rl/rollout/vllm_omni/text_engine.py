"""`VllmTextEngine`: the rollout contract over `vllm.LLM` for text models (`rollout.backend=vllm`).

Serves causal LMs and the Qwen3-Omni thinker, one seeded `SamplingParams` per request; vLLM's
log-probs match the trainer's only for top_p = 1, so top_p < 1 and prompts with media are
refused (use `native`). LoRA updates go as a PEFT folder per version, full updates bucket by
bucket through `collective_rpc` (`vllm_worker.py`). Sampling is synchronous. `generate_turns`
samples an agent's multi-turn trajectories, turn by turn on vLLM's engine with its prefix cache
reusing what earlier turns encoded (`text_turns.py`).

Routed experts (algo.family_options.routing_replay=r3, a MoE model): where vLLM's V2 model runner
runs (it needs Triton) vLLM returns them itself (`enable_return_routed_experts`, each completion's
`routed_experts` [tokens, decoder layers, k]); elsewhere (vLLM's CPU build, whose Triton has no
CPU backend, runs the V1 runner) the worker extension captures them from the MoE routers, with
prefix caching off (a cached prompt block is not recomputed, so it would have no routes). Either
way each result carries them as the native engine records them (`TextResult.routes`: the MoE
layers only, prompt and response tokens from position 0). Left out: media prompts, top_p < 1.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import logging
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.rollout.base import SynchronousRolloutEngine, check_weight_kind
from omni_rl.rollout.text_types import TextRequest, TextResult
from omni_rl.rollout.vllm_omni.availability import require
from omni_rl.rollout.vllm_omni.text_turns import decode_turns_vllm, turn_seed
from omni_rl.utils.tensor_buckets import NamedTensors, named_buckets

WORKER_EXTENSION = "omni_rl.rollout.vllm_omni.vllm_worker.OmniRLVllmWorkerExtension"
_PEFT_PREFIX = "base_model.model."
log = logging.getLogger(__name__)
# vLLM's `LoRAConfig.max_lora_rank` values (`MaxLoRARanks`, vllm/config/lora.py, 0.30.0).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts that holds a LoRA of `rank` (4 -> 8): vLLM sizes its LoRA
    buffers by `max_lora_rank` and serves any adapter of a rank up to it."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(f"model.lora.rank={rank}: expected at most {VLLM_LORA_RANKS[-1]} with rollout.backend=vllm "
                     f"(vLLM's largest max_lora_rank)")


def sleep_mode_for(requested: bool, available: bool, platform: str) -> bool:
    """Whether to start vLLM with its sleep mode: as requested where the platform has it; else
    off, with one warning naming the option (vLLM itself would refuse to start)."""
    if requested and not available:
        log.warning("rollout.backend_options.sleep_mode=true, but vLLM has no sleep mode on this platform (%s): the engine "
                    "starts without it, and its sleep() / wake() are refused; set rollout.backend_options.sleep_mode=false "
                    "to silence this", platform)
        return False
    return requested


def weight_blob(bucket: dict[str, torch.Tensor], prefix: str) -> bytes:
    """One bucket of the trainer's full weights as a safetensors file's bytes, named as the
    checkpoint names them (`prefix` + name): the form vLLM's `collective_rpc` carries."""
    from safetensors.torch import save

    # A copy of each tensor: safetensors refuses tensors that share memory (a tied head).
    return save({prefix + name: t.detach().to("cpu", copy=True).contiguous() for name, t in bucket.items()})


def check_text_request(req: TextRequest) -> None:
    """Refuse, naming the request, what this engine cannot sample as the trainer scores it."""
    if req.max_new_tokens < 1 or req.temperature <= 0:
        raise ValueError(f"request {req.request_id}: max_new_tokens={req.max_new_tokens}, temperature={req.temperature}; "
                         f"expected max_new_tokens >= 1 and temperature > 0")
    if req.top_p != 1.0:
        raise ValueError(f"request {req.request_id}: top_p={req.top_p}; rollout.backend=vllm needs top_p=1 (vLLM's "
                         f"processed log-probs renormalise over the nucleus, the trainer's do not)")
    if req.prompt.media:
        raise ValueError(f"request {req.request_id}: a prompt with media ({sorted(req.prompt.media)}); "
                         f"rollout.backend=vllm samples text prompts: use rollout.backend=native for media")


def checkpoint_named(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full weights as the checkpoint names and shapes them, which vLLM's loader reads: transformers
    holds some in another layout in memory (a MoE's experts fused into one [E, ...] tensor), and
    undoes that on save (`revert_weight_conversion`); other modules' names are kept."""
    from transformers import PreTrainedModel
    from transformers.core_model_loading import revert_weight_conversion

    if not isinstance(model, PreTrainedModel):
        return tensors
    return revert_weight_conversion(model, dict(tensors))


def peft_lora_files(tensors: dict[str, torch.Tensor], rank: int, alpha: float, targets: Any,
                    prefix: str = "") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Our LoRA tensors (`...q_proj.lora_A.default.weight`, as PEFT names them in memory) as a
    PEFT adapter file's tensors (`base_model.model.<checkpoint name>.lora_A.weight`) and its config."""
    state = {}
    for name, value in tensors.items():
        key = re.sub(r"\.lora_([AB])\.[^.]+\.weight$", r".lora_\1.weight", name)
        if not re.search(r"\.lora_[AB]\.weight$", key):
            raise ValueError(f"update_weights(kind='lora'): {name!r} is not a LoRA A/B tensor")
        key = key[len(_PEFT_PREFIX):] if key.startswith(_PEFT_PREFIX) else key
        state[_PEFT_PREFIX + prefix + key] = value.detach().cpu().contiguous()
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": targets,
              "bias": "none", "task_type": "CAUSAL_LM", "lora_dropout": 0.0}
    return state, config


def completion_log_probs(req: TextRequest, token_ids: Sequence[int], logprobs: Sequence[Any]) -> list[float]:
    """The sampled tokens' log-probs of one vLLM completion (`logprobs`: one dict per token, token id
    -> Logprob, as `logprobs=0` returns them)."""
    if len(logprobs) != len(token_ids):
        raise ValueError(f"request {req.request_id}: vLLM returned {len(token_ids)} tokens but {len(logprobs)} "
                         f"log-prob entries; was it asked for logprobs=0?")
    return [float(getattr(step[tok], "logprob", step[tok])) for tok, step in zip(token_ids, logprobs)]


def result_from_completion(req: TextRequest, token_ids: Sequence[int], logprobs: Sequence[Any],
                           finish_reason: Optional[str], text: str, weight_version: int) -> TextResult:
    """A `TextResult` from one vLLM completion (`CompletionOutput`'s token_ids, logprobs (one dict
    per token, token id -> Logprob), finish_reason and text)."""
    values = completion_log_probs(req, token_ids, logprobs)
    return TextResult(
        request_id=req.request_id, prompt=req.prompt, response_ids=torch.tensor(list(token_ids), dtype=torch.long),
        log_probs=torch.tensor(values, dtype=torch.float32), finish_reason="stop" if finish_reason == "stop" else "length",
        text=text, temperature=req.temperature, top_p=req.top_p, weight_version=weight_version,
    )


# How the engine records routed experts: vLLM returns them, or the worker extension captures them.
VLLM_RETURNS, EXTENSION_CAPTURES = "vllm", "extension"


def route_capture(engine_args_class: type, has_triton: bool, v2_runner_env: Optional[bool]) -> str:
    """Who records routed experts: vLLM itself where its `EngineArgs` (a dataclass) has
    `enable_return_routed_experts` and its V2 model runner runs (vLLM wires routed experts to that
    runner only, and it needs Triton, unless VLLM_USE_V2_MODEL_RUNNER=0 turns it off); else the
    worker extension (`vllm_worker.OmniRLVllmWorkerExtension.omni_rl_capture_routes`)."""
    names = {f.name for f in dataclasses.fields(engine_args_class)}
    if "enable_return_routed_experts" in names and has_triton and v2_runner_env is not False:
        return VLLM_RETURNS
    return EXTENSION_CAPTURES


def routed_experts_line(version: str, capture: str) -> str:
    """The start-up line on how this engine records routed experts (`route_capture`)."""
    if capture == VLLM_RETURNS:
        return f"vLLM {version} returns the routed experts (enable_return_routed_experts)"
    return (f"vLLM {version} cannot return routed experts here (it does so from its V2 model runner only, which "
            f"needs Triton with this platform's backend): the omni-rl worker extension captures them from the MoE "
            f"routers, with prefix caching off")


def routes_of_completion(req: TextRequest, rows: Optional[torch.Tensor], response_len: int, moe_layers: Sequence[int],
                         layout) -> torch.Tensor:
    """`TextResult.routes` [P + R - 1, MoE layers, k] of one completion from vLLM's rows [S, layers, k]
    (positions 0 .. S - 1; `moe_layers` picks the MoE layers' columns, in order; -1: not recorded),
    checked against the model's `layout` (`moe_routing.RouterLayout`); one error naming the request."""
    from omni_rl.models.moe_routing import RoutingReplayError

    needed = len(req.prompt.input_ids) + response_len - 1  # the last sampled token feeds no forward
    if rows is None or rows.shape[0] < needed:
        got = "no routes" if rows is None else f"routes for {rows.shape[0]} tokens"
        raise RoutingReplayError(
            f"request {req.request_id}: vLLM returned {got}, expected {needed} (its prompt's {len(req.prompt.input_ids)} "
            f"tokens and {response_len - 1} fed response tokens); routing_replay=r3 cannot replay it")
    if rows.dim() != 3 or max(moe_layers, default=-1) >= rows.shape[1]:
        raise RoutingReplayError(f"request {req.request_id}: vLLM's routes of shape {tuple(rows.shape)}, expected "
                                 f"[tokens, layers, k] with the MoE layers {list(moe_layers)}")
    picked = rows[:needed, list(moe_layers)].long()
    if bool((picked < 0).any()):
        token = int((picked < 0).any(-1).any(-1).nonzero()[0, 0])
        raise RoutingReplayError(f"request {req.request_id}: vLLM recorded no route at token {token} of {needed}; "
                                 f"routing_replay=r3 cannot replay it")
    layout.check(picked, f"request {req.request_id}")
    return picked.to(layout.dtype)


class VllmTextEngine(SynchronousRolloutEngine):
    def __init__(self, cfg: OmniConfig, model, path: str, options):
        require("vllm")
        from vllm import LLM
        from vllm.platforms import current_platform

        # The trainer-side adapter, for its tokenizer, stop tokens and LoRA targets only: vLLM samples
        # with a copy of its own, so this engine never shares the model (`shares_model_with`).
        self.trainer_adapter = model
        self.cfg = cfg
        self.options = options  # rollout.backend_options (VllmOptions)
        r, lora = cfg.rollout, cfg.model.lora
        self.weight_version = 0
        # turn_*: multi-turn decoding (`generate_turns`): vLLM steps, those that held trajectories at
        # different turns, the prompt tokens of continued turns and those vLLM's prefix cache served.
        self.stats = {"samples": 0, "generate_calls": 0, "weight_updates": 0, "turn_steps": 0, "mixed_turn_steps": 0,
                      "continued_prompt_tokens": 0, "prefix_cached_tokens": 0}
        self.prefix = model.checkpoint_prefix
        self._lora_request = None
        self._lora_dirs: list[str] = []
        self.sleep_mode = sleep_mode_for(options.sleep_mode, current_platform.is_sleep_mode_available(),
                                         str(current_platform.device_type))
        # Routed experts, for routing_replay=r3 on a MoE model (None: not recorded).
        self.route_layout = model.routing.layout if (
            cfg.algo.family_options.routing_replay == "r3" and model.routing is not None) else None
        self.route_capture, extra = None, {}
        if self.route_layout is not None:
            from vllm import envs
            from vllm.engine.arg_utils import EngineArgs
            from vllm.triton_utils import HAS_TRITON

            self.route_capture = route_capture(EngineArgs, HAS_TRITON, envs.VLLM_USE_V2_MODEL_RUNNER)
            extra = ({"enable_return_routed_experts": True} if self.route_capture == VLLM_RETURNS
                     else {"enable_prefix_caching": False})
        self.llm = LLM(
            model=path, dtype=cfg.model.dtype, seed=cfg.trainer.seed, max_num_seqs=r.max_num_seqs,
            gpu_memory_utilization=options.gpu_memory_utilization, enforce_eager=options.enforce_eager,
            enable_sleep_mode=self.sleep_mode, enable_lora=lora.enabled, max_lora_rank=vllm_max_lora_rank(lora.rank) if lora.enabled else 16,
            max_loras=1, logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION, **extra,
        )
        # What vLLM resolved (its CPU build turns prefix caching off for MLA models, for one).
        self.prefix_caching = bool(self.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching)
        self.moe_layers: list[int] = []
        if self.route_capture is not None:
            import vllm

            log.info(routed_experts_line(vllm.__version__, self.route_capture))
            call = "omni_rl_moe_layers" if self.route_capture == VLLM_RETURNS else "omni_rl_capture_routes"
            self.moe_layers = list(self.llm.collective_rpc(call)[0])
            if len(self.moe_layers) != self.route_layout.num_layers:
                self.close()
                raise RuntimeError(
                    f"vLLM's {path} has MoE layers {self.moe_layers}, but the trainer's model has "
                    f"{self.route_layout.num_layers} routers; the rollout and the trainer must load the same model")

    def _params(self, req: TextRequest, seed: int, max_tokens: int):
        from vllm import SamplingParams

        eos = set(self.trainer_adapter.eos_token_ids)
        return SamplingParams(n=1, temperature=req.temperature, top_p=1.0, seed=seed, max_tokens=max_tokens,
                              stop_token_ids=sorted(eos | set(req.stop_token_ids)), logprobs=0)

    def generate(self, requests: Sequence[TextRequest], timeout_s: float | None = None) -> list[TextResult]:
        for req in requests:
            check_text_request(req)
        params = [self._params(req, req.seed, req.max_new_tokens) for req in requests]
        prompts = [{"prompt_token_ids": req.prompt.input_ids.tolist()} for req in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora_request)
        self.stats["generate_calls"] += 1
        captured = self._captured_routes()
        results = []
        for req, out in zip(requests, outputs):
            done = out.outputs[0]
            tokens = list(done.token_ids)
            result = result_from_completion(req, tokens, done.logprobs or [], done.finish_reason,
                                            self.trainer_adapter.decode_tokens(tokens), self.weight_version)
            if self.route_capture is not None and req.record_routes:
                if self.route_capture == VLLM_RETURNS:
                    rows = None if done.routed_experts is None else torch.from_numpy(done.routed_experts.astype("int32"))
                    result.routes = routes_of_completion(req, rows, len(tokens), self.moe_layers, self.route_layout)
                else:
                    result.routes = routes_of_completion(req, captured.get(out.request_id), len(tokens),
                                                         range(len(self.moe_layers)), self.route_layout)
            results.append(result)
        self.stats["samples"] += len(results)
        return results

    def generate_turns(self, requests: Sequence[TextRequest], handler, max_total_tokens: int) -> list[TextResult]:
        """Multi-turn trajectories (one request each): each turn a vLLM request whose prompt is the
        trajectory so far, its prefix's KV found in vLLM's prefix cache (`text_turns.py`)."""
        from vllm.sampling_params import RequestOutputKind

        for req in requests:
            check_text_request(req)
            if req.record_routes:
                raise ValueError("generate_turns records no routed experts; set algo.family_options.routing_replay=off")
        if not self.prefix_caching:
            log.warning("vllm: prefix caching is off, so every turn of a multi-turn trajectory encodes its whole "
                        "prefix again")

        def params_for(req: TextRequest, turn: int, max_tokens: int):
            params = self._params(req, turn_seed(req.seed, turn), max_tokens)
            params.output_kind = RequestOutputKind.FINAL_ONLY  # a turn is read once it has ended
            return params

        results = decode_turns_vllm(self.llm.llm_engine, list(requests), handler, max_total_tokens, params_for,
                                    completion_log_probs, self.trainer_adapter.decode_tokens, self.weight_version,
                                    self.stats, self._lora_request)
        self.stats["generate_calls"] += 1
        return results

    def _captured_routes(self) -> dict[str, torch.Tensor]:
        """The worker extension's routes of the requests just sampled, by vLLM's request id (the
        one `LLM.generate` gave them: vLLM's engine adds a suffix of its own); empty when vLLM
        returns them itself."""
        if self.route_capture != EXTENSION_CAPTURES:
            return {}
        from safetensors.torch import load

        captured = load(self.llm.collective_rpc("omni_rl_take_routes")[0])
        return {name.rsplit("-", 1)[0]: rows for name, rows in captured.items()}


    def update_weights(self, tensors: NamedTensors, version: int, kind: str) -> None:
        check_weight_kind(kind)
        if kind == "lora":
            self._load_lora(dict(tensors), version)
        else:
            # Each bucket is serialized as it is sent, so this side holds one bucket's bytes at a time.
            tensors = checkpoint_named(self.trainer_adapter.trainable_root(), dict(tensors))
            buckets = list(named_buckets(tensors, self.cfg.trainer.weight_sync_bucket_mb << 20))
            for i, bucket in enumerate(buckets):
                self.llm.collective_rpc("omni_rl_load_weights", args=(weight_blob(bucket, self.prefix), i == len(buckets) - 1))
        self.weight_version = version
        self.stats["weight_updates"] += 1

    def _load_lora(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        lora = self.cfg.model.lora
        state, config = peft_lora_files(tensors, lora.rank, lora.alpha, self.trainer_adapter.lora_targets(), self.prefix)
        folder = Path(tempfile.mkdtemp(prefix=f"omni-rl-lora-v{version}-"))
        save_file(state, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps(config))
        # A new id per version: vLLM caches adapters by id. vLLM reads the folder at the first
        # generate that names it, so the one before stays until the next update.
        self._lora_request = LoRARequest(f"omni-rl-v{version}", version + 1, str(folder))
        self._lora_dirs.append(str(folder))
        while len(self._lora_dirs) > 2:
            shutil.rmtree(self._lora_dirs.pop(0), ignore_errors=True)

    def sleep(self) -> None:
        self._require_sleep_mode("sleep")
        self.llm.sleep(level=1)

    def wake(self) -> None:
        self._require_sleep_mode("wake")
        self.llm.wake_up()

    def _require_sleep_mode(self, what: str) -> None:
        if not self.sleep_mode:
            why = ("rollout.backend_options.sleep_mode=false; set it to true to free the GPU between rollouts"
                   if not self.options.sleep_mode else "no sleep mode: its platform has none (a CPU?)")
            raise RuntimeError(f"{what}(): the vllm engine was started with {why}")

    def close(self) -> None:
        llm, self.llm = self.llm, None
        try:
            if llm is not None:
                # LLM has no close(): its engine core (a process of its own by default) keeps its GPU
                # memory until shut down, so an engine per max_num_seqs setting would pile them up.
                llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            for folder in self._lora_dirs:
                shutil.rmtree(folder, ignore_errors=True)
            self._lora_dirs.clear()

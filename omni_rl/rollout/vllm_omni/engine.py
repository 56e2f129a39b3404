"""`VllmOmniDiffusionEngine`: the rollout contract over vLLM-Omni's `AsyncOmni` (`rollout.backend=vllm_omni`).

Runs `AsyncOmni` with our pipeline class (`pipelines.PIPELINE_CLASSES`) and worker extension on
an asyncio loop in its own thread; each request is one `generate` call, and weights go bucket by
bucket through `collective_rpc`. `same_log_probs_as` is False, so the trainer recomputes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
from concurrent.futures import Future
from typing import Any, Sequence

from omni_rl.config.schema import OmniConfig
from omni_rl.models.registry import adapter_key
from omni_rl.rollout.base import RolloutEngine, check_weight_kind
from omni_rl.rollout.diffusion_sampling import check_request
from omni_rl.rollout.base import RolloutEngineError, wait_results
from omni_rl.rollout.types import DiffusionRequest, DiffusionResult
from omni_rl.rollout.vllm_omni.availability import require
from omni_rl.rollout.vllm_omni.codec import request_to_prompt, result_from_output, sampling_fields
from omni_rl.rollout.vllm_omni.pipelines import SPEC_KEY, pipeline_class_for
from omni_rl.utils.tensor_buckets import NamedTensors, named_buckets

WORKER_EXTENSION = "omni_rl.rollout.vllm_omni.worker.OmniRLWorkerExtension"
_ids = itertools.count()


def engine_kwargs(cfg: OmniConfig, path: str, options) -> dict[str, Any]:
    """`AsyncOmni(**kwargs)` for the run: our pipeline class and the run's model config;
    `options` are the backend's (`rollout.backend_options`, `VllmOmniOptions`)."""
    r, architecture = cfg.rollout, adapter_key(cfg.model.adapter, cfg.model.stage)
    pipeline_class = pipeline_class_for(architecture)
    spec = {
        "model": dataclasses.asdict(cfg.model), "plugins": list(cfg.plugins), "seed": cfg.trainer.seed,
        "max_num_seqs": r.max_num_seqs, "architecture": architecture,
    }
    return {
        "model": path,
        # Our class name, not the checkpoint's: vLLM-Omni would run its own pre/post-processing
        # of the checkpoint's pipeline on our outputs.
        "model_class_name": pipeline_class.rsplit(".", 1)[1],
        "custom_pipeline_args": {"pipeline_class": pipeline_class, SPEC_KEY: spec},
        "worker_extension_cls": WORKER_EXTENSION,
        "max_num_seqs": r.max_num_seqs,
        "request_batch_max_wait_ms": options.max_wait_ms,
        "enable_sleep_mode": options.sleep_mode,
        "enforce_eager": options.enforce_eager,
        "dtype": cfg.model.dtype,
    }


def _check_rpc(answers: Any, what: str) -> None:
    """AsyncOmni's collective_rpc answers a stage that could not run the call with a dict
    (`{"error": ...}` or `{"todo": ...}`) instead of raising: raise it here."""
    for answer in answers if isinstance(answers, (list, tuple)) else [answers]:
        if isinstance(answer, (list, tuple)):
            _check_rpc(answer, what)
        elif isinstance(answer, dict) and (answer.get("error") or answer.get("todo")):
            raise RolloutEngineError(f"vLLM-Omni failed while {what}: {answer}")


class VllmOmniDiffusionEngine(RolloutEngine):
    def __init__(self, cfg: OmniConfig, model, path: str, options):
        require("vllm_omni")
        # The trainer-side adapter, for request checks only (it may be weightless); vLLM-Omni
        # samples with a copy of its own, so this engine never shares the model (`shares_model_with`).
        self.trainer_adapter = model
        self.cfg = cfg
        self.options = options  # rollout.backend_options (VllmOmniOptions)
        self.bucket_bytes = cfg.trainer.weight_sync_bucket_mb << 20
        self.weight_version = 0
        self.stats = {"submitted": 0, "samples": 0, "weight_updates": 0, "weight_buckets": 0}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="omni-rl-vllm-omni", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._omni = self._run(self._start(engine_kwargs(cfg, path, options)), options.server_startup_timeout_s)
        except BaseException:
            self._stop_loop()
            raise

    async def _start(self, kwargs: dict[str, Any]):
        from vllm_omni import AsyncOmni

        return AsyncOmni(**kwargs)

    def _run(self, coroutine, timeout_s: float | None = None):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=timeout_s)

    # --- the contract --------------------------------------------------------------------
    def submit_many(self, requests: Sequence[DiffusionRequest]) -> list[Future]:
        if self._closed:
            raise RolloutEngineError("the vllm_omni rollout engine is closed")
        for req in requests:
            self.check_request(req)
        self.stats["submitted"] += len(requests)
        return [asyncio.run_coroutine_threadsafe(self._generate_one(req), self._loop) for req in requests]

    def wait(self, requests: Sequence[DiffusionRequest], futures: Sequence[Future], timeout_s: float) -> list[DiffusionResult]:
        return wait_results(requests, futures, timeout_s)

    def check_request(self, req: DiffusionRequest) -> None:
        check_request(self.trainer_adapter, req)

    async def _generate_one(self, req: DiffusionRequest) -> DiffusionResult:
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        params = OmniDiffusionSamplingParams(**sampling_fields(req))
        final = None
        async for output in self._omni.generate(request_to_prompt(req), request_id=f"omni-rl-{next(_ids)}",
                                                sampling_params_list=[params]):
            final = output
        if final is None:
            raise RolloutEngineError(f"vLLM-Omni returned no output for request {req.request_id}")
        result = result_from_output(final)
        self.stats["samples"] += 1
        return result

    def update_weights(self, tensors: NamedTensors, version: int, kind: str) -> None:
        check_weight_kind(kind)
        buckets = named_buckets(tensors, self.bucket_bytes)
        bucket = next(buckets, {})
        while True:
            following = next(buckets, None)
            last = following is None
            cpu = {name: t.detach().cpu() for name, t in bucket.items()}
            answers = self._run(self._omni.collective_rpc("omni_rl_load_tensors", args=(cpu, kind, version if last else None)))
            _check_rpc(answers, f"updating weights to version {version} ({kind})")
            self.stats["weight_buckets"] += 1
            if last:
                break
            bucket = following
        self.stats["weight_updates"] += 1
        self.weight_version = version

    def sleep(self) -> None:
        self._require_sleep_mode("sleep")
        self._run(self._omni.sleep(level=1))

    def wake(self) -> None:
        self._require_sleep_mode("wake")
        self._run(self._omni.wake_up())

    def _require_sleep_mode(self, what: str) -> None:
        if not self.options.sleep_mode:
            raise RolloutEngineError(f"{what}(): the vllm_omni engine was started with rollout.backend_options.sleep_mode=false; "
                                     f"set it to true to free the GPU between rollouts")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # On the engine's loop: AsyncOmni.shutdown() cancels its output task, which lives there
            # (asyncio objects are not thread-safe), then stops vLLM-Omni's processes.
            self._run(self._shutdown(), timeout_s=120)
        finally:
            self._stop_loop()

    async def _shutdown(self) -> None:
        self._omni.shutdown()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

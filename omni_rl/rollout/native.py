"""The native diffusion rollout engine: in-process, with request-level (continuous) batching.

Each sample is a request (`DiffusionRequest`) with its own seed. A scheduler thread keeps a set
of running samples and, at every iteration, packs up to `max_num_seqs` running samples that share
a batch key (resolution, step count, guidance, kernel) into one transformer forward, even when
they are at different denoising steps: sigma is per sample. A request that arrives while others
run joins at the next iteration. An idle engine waits up to `max_wait_ms` for a batch to fill
before it starts.

Why a sample's result does not depend on its batch-mates: its initial noise, its SDE window and
every step's noise come from its own generator, and the step kernel treats samples
independently. Only the transformer forward is shared, and it is per-sample up to floating-point
reduction order (~1e-7).

Failure never hangs a caller: an exception in the loop fails every pending request's future with
that error, and the engine refuses new work after it. Callers wait with a timeout.

Weight sync: when the trainer's model *is* this engine's model (colocated, one process), the
weights are already current and `sync_weights` only records the version; otherwise
`update_weights` copies the named trainable tensors (LoRA only, when LoRA is on) in between two
iterations. Every result records the weight version it was sampled with.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from omni_rl.algos.flow_sde import get_step_kernel, step_latents
from omni_rl.models.conditioning import Conditioning
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.rollout.base import RolloutEngine, check_weight_kind
from omni_rl.rollout.sde_window import choose_sde_window
from omni_rl.rollout.types import DiffusionRequest, DiffusionResult
from omni_rl.algos import latent_streams as ls
from omni_rl.utils.tensor_buckets import NamedTensors, named_buckets


_BUCKET_BYTES = 512 << 20  # tensors handed over at once; a stream of them is consumed bucket by bucket


class RolloutEngineError(RuntimeError):
    """The engine failed or timed out; the message says which requests and why."""


def encoding_key(req: DiffusionRequest) -> tuple:
    """What a request's embeddings depend on: its prompt, negative prompt and condition images
    (by content, so requests that carry equal images, e.g. a group's, share one encoding)."""
    images = None
    if req.images is not None:
        images = tuple((tuple(im.shape), hashlib.sha1(im.contiguous().numpy().tobytes()).hexdigest()) for im in req.images)
    return (req.prompt, req.negative_prompt, images)


@dataclass(eq=False)  # identity, not field-wise equality: requests hold tensors
class _Running:
    """A sample in flight: where it is in its trajectory and what it has recorded so far."""

    request: DiffusionRequest
    future: Future
    generator: torch.Generator
    window: tuple[int, int]
    sigmas: torch.Tensor
    conditioning: Conditioning
    x: ls.Latents
    step: int = 0
    window_latents: list = field(default_factory=list)
    log_probs: list = field(default_factory=list)
    noise_levels: list = field(default_factory=list)


class NativeDiffusionEngine(RolloutEngine):
    """Request-batched sampler around a `DiffusionModelBase` adapter."""

    def __init__(self, model: DiffusionModelBase, max_num_seqs: int = 32, max_wait_ms: float = 5.0):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs}: expected >= 1")
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.max_wait_s = max_wait_ms / 1000.0
        self.weight_version = 0
        self.stats = {"forwards": 0, "samples": 0, "forward_batch_sum": 0}
        self._queue: deque[tuple[DiffusionRequest, Future]] = deque()
        self._running: list[_Running] = []
        self._cv = threading.Condition()
        self._compute_lock = threading.Lock()
        self._error: Optional[BaseException] = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="omni-rl-rollout", daemon=True)
        self._thread.start()

    # --- public API ----------------------------------------------------------------------
    def submit(self, request: DiffusionRequest) -> Future:
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[DiffusionRequest]) -> list[Future]:
        # A malformed request is refused here, to its caller alone: admitted, it would stop the
        # engine and fail every other caller's samples with it.
        for req in requests:
            self._check_request(req)
        futures = []
        with self._cv:
            self._check_alive()
            for req in requests:
                fut: Future = Future()
                self._queue.append((req, fut))
                futures.append(fut)
            self._cv.notify_all()
        return futures

    def generate(self, requests: Sequence[DiffusionRequest], timeout_s: float = 1800.0) -> list[DiffusionResult]:
        """Submit all requests at once and wait for them (results in request order)."""
        return self.wait(requests, self.submit_many(requests), timeout_s)

    def wait(self, requests: Sequence[DiffusionRequest], futures: Sequence[Future], timeout_s: float) -> list[DiffusionResult]:
        """Results of submitted requests, in order; a failure or a timeout raises
        `RolloutEngineError` naming the request."""
        deadline = time.monotonic() + timeout_s
        results = []
        for req, fut in zip(requests, futures):
            try:
                results.append(fut.result(timeout=max(0.0, deadline - time.monotonic())))
            except FutureTimeout:
                raise RolloutEngineError(
                    f"rollout timed out after {timeout_s:.0f} s waiting for request {req.request_id} "
                    f"(prompt {req.prompt!r}); raise rollout.timeout_s if the model is just slow"
                ) from None
            except Exception as err:
                raise RolloutEngineError(
                    f"rollout failed for request {req.request_id} (prompt {req.prompt!r}): {err!r}"
                ) from err
        return results

    def _check_request(self, req: DiffusionRequest) -> None:
        shape = self.model.latent_shape(req.height, req.width, req.num_frames)  # raises for an impossible geometry
        if req.initial_noise is not None and ls.shape_of(req.initial_noise) != shape:
            raise ValueError(
                f"request {req.request_id}: initial_noise has shape {ls.shape_of(req.initial_noise)}, "
                f"expected {shape} for {req.height}x{req.width}" + (f"x{req.num_frames} frames" if req.num_frames > 1 else "")
            )
        if req.num_steps < 1:
            raise ValueError(f"request {req.request_id}: num_steps={req.num_steps}, expected >= 1")
        choose_sde_window(req.seed, req.num_steps, req.sde_window_size, req.sde_window_range)

    def same_log_probs_as(self, model) -> bool:
        # The trainer's model itself, in fp32: the trainer's replay calls the same
        # predict_velocity and kernel on the same inputs (other precisions differ by batch shape).
        return model is self.model and self.model.dtype == torch.float32

    def update_weights(self, tensors: NamedTensors, version: int, kind: str) -> None:
        """Load named trainable tensors between two iterations, never during a forward."""
        check_weight_kind(kind)
        for bucket in named_buckets(tensors, _BUCKET_BYTES):
            with self._compute_lock:
                self.model.load_named_tensors(bucket)
        self.weight_version = version

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=10)

    # --- scheduler loop ------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._error is not None:
            raise RolloutEngineError(f"rollout engine stopped after an error: {self._error!r}")
        if self._closed:
            raise RolloutEngineError("rollout engine is closed")

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._queue and not self._running:
                    self._cv.wait()
                if self._closed:
                    self._fail_all(RolloutEngineError("rollout engine closed with requests pending"))
                    return
                if not self._running:
                    # Idle engine: give a burst of requests max_wait to fill a batch.
                    deadline = time.monotonic() + self.max_wait_s
                    while len(self._queue) < self.max_num_seqs and not self._closed:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cv.wait(timeout=left)
                admitted = self._pop_admissible()
            # Compute outside the queue lock, so callers can submit while a forward runs.
            try:
                with self._compute_lock:
                    self._admit(admitted)
                    self._iterate()
            except BaseException as err:  # noqa: BLE001 (every failure must reach the callers)
                with self._cv:
                    for req, fut in admitted:
                        if not fut.done():
                            fut.set_exception(err)
                    self._error = err
                    self._fail_all(err)
                return

    def _pop_admissible(self) -> list[tuple[DiffusionRequest, Future]]:
        room = self.max_num_seqs - len(self._running)
        taken = []
        while self._queue and len(taken) < room:
            taken.append(self._queue.popleft())
        return taken

    def _fail_all(self, err: BaseException) -> None:
        for run in self._running:
            if not run.future.done():
                run.future.set_exception(err)
        self._running.clear()
        while self._queue:
            _, fut = self._queue.popleft()
            if not fut.done():
                fut.set_exception(err)

    def _encode(self, admitted: list[tuple[DiffusionRequest, Future]]) -> dict[tuple, Conditioning]:
        """Every distinct (prompt, negative prompt, condition images) among the requests that
        arrived without embeddings, encoded in one batched call per negative prompt and kind."""
        need = {encoding_key(req): req for req, _ in admitted if req.conditioning is None}
        encoded: dict[tuple, Conditioning] = {}
        for negative, with_images in sorted({(key[1], key[2] is not None) for key in need}):
            keys = sorted(k for k in need if k[1] == negative and (k[2] is not None) == with_images)
            extra = {"images": [need[k].images for k in keys]} if with_images else {}
            cond = self.model.encode_prompts([k[0] for k in keys], negative_prompt=negative, **extra)
            for i, key in enumerate(keys):
                encoded[key] = cond.select([i])
        return encoded

    @torch.no_grad()
    def _admit(self, admitted: list[tuple[DiffusionRequest, Future]]) -> None:
        if not admitted:
            return
        encoded = self._encode(admitted)
        for req, fut in admitted:
            if not fut.set_running_or_notify_cancel():
                continue
            shape = self.model.latent_shape(req.height, req.width, req.num_frames)
            generator = torch.Generator(device="cpu").manual_seed(req.seed)
            if req.initial_noise is not None:
                x = ls.clone(ls.to(req.initial_noise, dtype=torch.float32))
            else:
                x = ls.randn(shape, generator=generator)
            window = choose_sde_window(req.seed, req.num_steps, req.sde_window_size, req.sde_window_range)
            cond = req.conditioning if req.conditioning is not None else encoded[encoding_key(req)]
            self._running.append(
                _Running(
                    request=req, future=fut, generator=generator, window=window,
                    sigmas=self.model.sigmas(req.num_steps, req.height, req.width, req.num_frames), conditioning=cond, x=x,
                )
            )

    @torch.no_grad()
    def _iterate(self) -> None:
        """One batched forward over the running samples that share the oldest one's batch key."""
        if not self._running:
            return
        key = self._running[0].request.batch_key()
        batch = [r for r in self._running if r.request.batch_key() == key][: self.max_num_seqs]
        first = batch[0].request
        device = self.model.device
        x = ls.to(ls.stack([r.x for r in batch]), device)
        sigma = torch.stack([r.sigmas[r.step] for r in batch]).to(device)
        sigma_next = torch.stack([r.sigmas[r.step + 1] for r in batch]).to(device)
        in_window = [r.window[0] <= r.step < r.window[1] for r in batch]
        noise = torch.tensor(
            [r.request.noise_level if w else 0.0 for r, w in zip(batch, in_window)], dtype=torch.float32, device=device
        )
        cond = Conditioning.cat([r.conditioning for r in batch])
        velocity = self.model.predict_velocity(x, sigma, cond, first.guidance_scale)
        step = step_latents(
            get_step_kernel(first.kernel), model_output=velocity, sigma=sigma, sigma_next=sigma_next, sample=x,
            noise_level=noise, generator=[r.generator for r in batch],
        )
        self.stats["forwards"] += 1
        self.stats["forward_batch_sum"] += len(batch)
        finished = []
        for i, run in enumerate(batch):
            if in_window[i]:
                run.window_latents.append(run.x)
                run.log_probs.append(step.log_prob[i].cpu())
                run.noise_levels.append(noise[i].cpu())
            # clone: a view would keep the whole batch's tensor alive in every result.
            run.x = ls.clone(ls.to(ls.index(step.prev_sample, i), "cpu"))
            run.step += 1
            if run.step == run.window[1]:
                run.window_latents.append(run.x)
            if run.step == run.request.num_steps:
                finished.append(run)
        if finished:
            self._finish(finished)

    def _finish(self, finished: list[_Running]) -> None:
        to_decode = [r for r in finished if r.request.decode]
        images, sounds, rate = {}, {}, None
        if to_decode:
            clean = ls.stack([r.x for r in to_decode])
            pixels = self.model.decode(clean)
            images = {id(r): pixels[i] for i, r in enumerate(to_decode)}
            if getattr(self.model, "makes_audio", False):
                waves, rate = self.model.decode_audio(clean)
                sounds = {id(r): waves[i] for i, r in enumerate(to_decode)}
        for run in finished:
            start, stop = run.window
            result = DiffusionResult(
                request_id=run.request.request_id,
                prompt=run.request.prompt,
                window=run.window,
                latents=ls.stack(run.window_latents),
                log_probs=torch.stack(run.log_probs) if run.log_probs else torch.zeros(0),
                sigmas=run.sigmas[start:stop].clone(),
                sigmas_next=run.sigmas[start + 1 : stop + 1].clone(),
                noise_levels=torch.stack(run.noise_levels) if run.noise_levels else torch.zeros(0),
                final_latent=run.x,
                conditioning=run.conditioning,
                image=images.get(id(run)),
                guidance_scale=run.request.guidance_scale,
                kernel=run.request.kernel,
                fps=run.request.fps,
                audio=sounds.get(id(run)),
                sample_rate=rate if id(run) in sounds else None,
                weight_version=self.weight_version,
            )
            self._running.remove(run)
            self.stats["samples"] += 1
            run.future.set_result(result)

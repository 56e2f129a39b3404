"""The per-request maths of diffusion rollout, shared by every engine that samples with our adapters.

`encode_conditionings`, `start_sample`, `advance`, `finish_samples`, and `sample_requests` (all
four for a fixed set). Left out: threads, futures and queues (the native engine's), transport
(the vLLM-Omni glue's).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from omni_rl.algos import latent_streams as ls
from omni_rl.algos.flow_sde import STEP_KERNELS, check_step, get_step_kernel, step_latents
from omni_rl.models.conditioning import Conditioning
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.rollout.sde_window import choose_sde_window
from omni_rl.rollout.types import DiffusionRequest, DiffusionResult


TRAJECTORY_DEVICES = ("device", "cpu")


@dataclass(eq=False)  # identity, not field-wise equality: requests hold tensors
class SampleState:
    """A sample in flight: where it is in its trajectory and what it has recorded so far. Every
    tensor is on the model's device; `step_noise[k]` is step k's noise level (0 outside the window)."""

    request: DiffusionRequest
    generator: torch.Generator
    window: tuple[int, int]
    sigmas: torch.Tensor
    conditioning: Conditioning
    x: ls.Latents
    step_noise: torch.Tensor
    step: int = 0
    window_latents: list = field(default_factory=list)
    log_probs: list = field(default_factory=list)
    noise_levels: list = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.step == self.request.num_steps


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# The longest prompt (or negative prompt) a request may carry, in characters: a 10 MB prompt held a
# rollout server's tokenizer for over a minute. Above the trainer's own default bound
# (`omni_rl.data.prompt_chars`: 200,000 characters), so the server never refuses what a run's
# prompt check accepted unless algo.family_options.max_prompt_tokens allows prompts of over 3,900 tokens.
MAX_REQUEST_PROMPT_CHARS = 1_000_000


def check_request(model: DiffusionModelBase, req: DiffusionRequest) -> None:
    """Raise `ValueError` naming the request for a field it cannot have: a kernel, seed, noise
    level, guidance, size, conditioning, geometry, noise or window (engines call it at
    submission, so a bad request never reaches a scheduler loop that other requests share)."""
    rid = getattr(req, "request_id", "?")
    if not isinstance(req, DiffusionRequest):
        raise ValueError(f"request {rid}: a {type(req).__name__}; expected a DiffusionRequest for a diffusion model")
    if req.kernel not in STEP_KERNELS:
        raise ValueError(f"request {rid}: kernel={req.kernel!r}; expected one of {STEP_KERNELS.names()}")
    if not _is_int(req.seed) or not -(2**63) <= req.seed < 2**64:
        raise ValueError(f"request {rid}: seed={req.seed!r}; expected an int in [-2**63, 2**64)")
    for name in ("height", "width", "num_frames", "num_steps", "sde_window_size"):
        value = getattr(req, name)
        if not _is_int(value) or value < (0 if name == "sde_window_size" else 1):
            raise ValueError(f"request {rid}: {name}={value!r}; expected an int >= {0 if name == 'sde_window_size' else 1}")
    if not _is_finite(req.noise_level) or req.noise_level < 0:
        raise ValueError(f"request {rid}: noise_level={req.noise_level!r}; expected a finite number >= 0")
    if not _is_finite(req.guidance_scale):
        raise ValueError(f"request {rid}: guidance_scale={req.guidance_scale!r}; expected a finite number")
    if not _is_finite(req.fps) or req.fps <= 0:
        raise ValueError(f"request {rid}: fps={req.fps!r}; expected a finite number > 0")
    if not isinstance(req.prompt, str) or not isinstance(req.negative_prompt, str):
        raise ValueError(f"request {rid}: prompt and negative_prompt must be strings")
    for name in ("prompt", "negative_prompt"):
        chars = len(getattr(req, name))
        if chars > MAX_REQUEST_PROMPT_CHARS:
            raise ValueError(f"request {rid}: {name} has {chars:,} characters; expected at most "
                             f"{MAX_REQUEST_PROMPT_CHARS:,} (tokenizers are not safe on unbounded text; the "
                             f"trainer bounds its prompts by algo.family_options.max_prompt_tokens when they load)")
    if req.images is not None:
        if not model.takes_source_image:
            raise ValueError(f"request {rid}: carries condition images, but {type(model).__name__} is a "
                             f"text-to-image model (it takes none)")
        if not isinstance(req.images, tuple) or not all(
                isinstance(im, torch.Tensor) and im.dtype == torch.uint8 and im.ndim == 3 and im.shape[-1] == 3
                for im in req.images):
            raise ValueError(f"request {rid}: images must be a tuple of uint8 [H, W, 3] tensors")
    shape = model.latent_shape(req.height, req.width, req.num_frames)  # raises for an impossible geometry
    if req.initial_noise is not None and ls.shape_of(req.initial_noise) != shape:
        raise ValueError(
            f"request {req.request_id}: initial_noise has shape {ls.shape_of(req.initial_noise)}, "
            f"expected {shape} for {req.height}x{req.width}" + (f"x{req.num_frames} frames" if req.num_frames > 1 else "")
        )
    if req.num_steps < 1:
        raise ValueError(f"request {req.request_id}: num_steps={req.num_steps}, expected >= 1")
    choose_sde_window(req.seed, req.num_steps, req.sde_window_size, req.sde_window_range)


def encoding_key(req: DiffusionRequest) -> tuple:
    """What a request's embeddings depend on: its prompt, negative prompt and condition images
    (by content, so requests that carry equal images, e.g. a group's, share one encoding)."""
    images = None
    if req.images is not None:
        images = tuple((tuple(im.shape), hashlib.sha1(im.contiguous().numpy().tobytes()).hexdigest()) for im in req.images)
    return (req.prompt, req.negative_prompt, images)


@torch.no_grad()
def encode_conditionings(model: DiffusionModelBase, requests: Sequence[DiffusionRequest]) -> list[Conditioning]:
    """Each request's conditioning: its own, or that of its (prompt, negative prompt, condition
    images) from one batched call per negative prompt (and kind: with images or without)."""
    need = {encoding_key(req): req for req in requests if req.conditioning is None}
    encoded: dict[tuple, Conditioning] = {}
    for negative, with_images in sorted({(key[1], key[2] is not None) for key in need}):
        keys = sorted(k for k in need if k[1] == negative and (k[2] is not None) == with_images)
        extra = {"images": [need[k].images for k in keys]} if with_images else {}
        cond = model.encode_prompts([k[0] for k in keys], negative_prompt=negative, **extra)
        for i, key in enumerate(keys):
            encoded[key] = cond.select([i])
    return [req.conditioning if req.conditioning is not None else encoded[encoding_key(req)] for req in requests]


def start_sample(model: DiffusionModelBase, req: DiffusionRequest, cond: Conditioning) -> SampleState:
    """The sample's state at step 0, on the model's device. Its generator is seeded by the request
    alone and draws the initial noise (unless the request brings its own, or a `noise_seed` its
    group shares) and then every step's noise."""
    shape = model.latent_shape(req.height, req.width, req.num_frames)
    device = model.device
    generator = torch.Generator(device=device).manual_seed(req.seed)
    if req.initial_noise is not None:
        x = ls.clone(ls.to(req.initial_noise, device=device, dtype=torch.float32))
    elif req.noise_seed is not None:
        x = ls.randn(shape, generator=torch.Generator(device=device).manual_seed(req.noise_seed))
    else:
        x = ls.randn(shape, generator=generator)
    window = choose_sde_window(req.seed, req.num_steps, req.sde_window_size, req.sde_window_range)
    step_noise = torch.tensor([req.noise_level if window[0] <= k < window[1] else 0.0 for k in range(req.num_steps)],
                              dtype=torch.float32)
    sigmas = model.sigmas(req.num_steps, req.height, req.width, req.num_frames)
    if req.kernel != "ode":  # the whole schedule checked here, on the host, so no step checks it again
        check_step(req.kernel, sigmas[:-1], sigmas[1:], step_noise)
    # Host to device once per sample, asynchronously (not a stream sync), never per step.
    return SampleState(
        request=req, generator=generator, window=window, conditioning=cond.to(device), x=x,
        sigmas=sigmas.to(device, non_blocking=True), step_noise=step_noise.to(device, non_blocking=True),
    )


class BatchConditioning:
    """The conditioning of the last forward's batch, concatenated once and reused while the same
    samples run together (with continuous batching the batch changes only when samples are
    admitted or finish)."""

    def __init__(self):
        self._members: tuple = ()
        self._cond: Optional[Conditioning] = None
        self.builds = 0

    def of(self, batch: Sequence[SampleState]) -> Conditioning:
        members = tuple(batch)  # the states themselves (identity), kept alive so no id is reused
        if members != self._members or self._cond is None:
            self._members, self._cond = members, Conditioning.cat([r.conditioning for r in batch])
            self.builds += 1
        return self._cond


@torch.no_grad()
def advance(model: DiffusionModelBase, running: Sequence[SampleState], max_num_seqs: int,
            conditioning: Optional[BatchConditioning] = None) -> list[SampleState]:
    """One batched forward and step over the running samples that share the oldest one's batch
    key (at most `max_num_seqs`). Returns the batch it stepped; `running` keeps its order.
    Device tensors in, device tensors out: no host sync (state stays on the model's device)."""
    key = running[0].request.batch_key()
    batch = [r for r in running if r.request.batch_key() == key][:max_num_seqs]
    first = batch[0].request
    x = ls.stack([r.x for r in batch])
    sigma = torch.stack([r.sigmas[r.step] for r in batch])
    sigma_next = torch.stack([r.sigmas[r.step + 1] for r in batch])
    in_window = [r.window[0] <= r.step < r.window[1] for r in batch]
    noise = torch.stack([r.step_noise[r.step] for r in batch])
    cond = (conditioning or BatchConditioning()).of(batch)
    velocity = model.predict_velocity(x, sigma, cond, first.guidance_scale)
    step = step_latents(
        get_step_kernel(first.kernel), model_output=velocity, sigma=sigma, sigma_next=sigma_next, sample=x,
        noise_level=noise, generator=[r.generator for r in batch], validate=False,  # checked in start_sample
    )
    for i, run in enumerate(batch):
        if in_window[i]:
            run.window_latents.append(run.x)
            run.log_probs.append(step.log_prob[i])
            run.noise_levels.append(noise[i])
        # clone: a view would keep the whole batch's tensor alive in every result.
        run.x = ls.clone(ls.index(step.prev_sample, i))
        run.step += 1
        if run.step == run.window[1]:
            run.window_latents.append(run.x)
    return batch


def check_trajectory_device(where: str) -> str:
    if where not in TRAJECTORY_DEVICES:
        raise ValueError(f"rollout.backend_options.trajectory_device={where!r}: expected one of {', '.join(TRAJECTORY_DEVICES)}")
    return where


class _Destination:
    """Moves finished trajectories to `where` ("device": nowhere; "cpu": pinned host memory,
    non-blocking copies, one wait in `ready()` for all the copies queued)."""

    def __init__(self, where: str, device: torch.device):
        self.copy = check_trajectory_device(where) == "cpu" and device.type not in ("cpu", "meta")
        self.device = device

    def __call__(self, value):
        if not self.copy or value is None:
            return value
        if isinstance(value, Conditioning):
            return Conditioning({k: self(v) for k, v in value.tensors.items()}, dict(value.masks))
        if not isinstance(value, torch.Tensor):
            return value.map(self)  # LatentStreams
        if value.device.type == "cpu":
            return value
        host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        host.copy_(value, non_blocking=True)
        return host

    def ready(self) -> None:
        if self.copy:
            event = torch.Event(device=self.device)  # after every copy queued on this stream
            event.record()
            event.synchronize()


@torch.no_grad()
def finish_samples(model: DiffusionModelBase, finished: Sequence[SampleState],
                   weight_version: Optional[int], trajectory_device: str = "device") -> list[DiffusionResult]:
    """Decode the finished samples that asked for it (one batch) and assemble their results,
    each trajectory moved once to `trajectory_device`."""
    move = _Destination(trajectory_device, model.device)
    to_decode = [r for r in finished if r.request.decode]
    images, sounds, rate = {}, {}, None
    if to_decode:
        clean = ls.stack([r.x for r in to_decode])
        pixels = model.decode(clean)
        images = {id(r): pixels[i] for i, r in enumerate(to_decode)}
        if model.makes_audio:
            waves, rate = model.decode_audio(clean)
            sounds = {id(r): waves[i] for i, r in enumerate(to_decode)}
    results = []
    for run in finished:
        start, stop = run.window
        empty = torch.zeros(0, device=run.sigmas.device)
        results.append(DiffusionResult(
            request_id=run.request.request_id,
            prompt=run.request.prompt,
            window=run.window,
            latents=move(ls.stack(run.window_latents)),
            log_probs=move(torch.stack(run.log_probs) if run.log_probs else empty),
            sigmas=move(run.sigmas[start:stop].clone()),
            sigmas_next=move(run.sigmas[start + 1 : stop + 1].clone()),
            noise_levels=move(torch.stack(run.noise_levels) if run.noise_levels else empty),
            final_latent=move(run.x),
            conditioning=move(run.conditioning),
            image=images.get(id(run)),
            guidance_scale=run.request.guidance_scale,
            kernel=run.request.kernel,
            fps=run.request.fps,
            audio=sounds.get(id(run)),
            sample_rate=rate if id(run) in sounds else None,
            weight_version=weight_version,
        ))
    move.ready()
    return results


def sample_requests(model: DiffusionModelBase, requests: Sequence[DiffusionRequest], max_num_seqs: int,
                    weight_version: Optional[int] = None, trajectory_device: str = "device") -> list[DiffusionResult]:
    """Sample a fixed set of requests to the end; results in request order.

    Requests with different batch keys may come together (vLLM-Omni batches on its own key, which
    knows no step kernel): each forward takes the oldest running sample's key, as the native
    engine's iterations do, so every sample runs in the batches the native engine would give it."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs={max_num_seqs}: expected >= 1")
    for req in requests:
        check_request(model, req)
    running = [start_sample(model, req, cond) for req, cond in zip(requests, encode_conditionings(model, requests))]
    results: dict[int, DiffusionResult] = {}
    order = {id(run): i for i, run in enumerate(running)}
    conditioning = BatchConditioning()
    while running:
        finished = [run for run in advance(model, running, max_num_seqs, conditioning) if run.done]
        if finished:
            for run, result in zip(finished, finish_samples(model, finished, weight_version, trajectory_device)):
                results[order[id(run)]] = result
                running.remove(run)
    return [results[i] for i in range(len(requests))]

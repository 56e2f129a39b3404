"""Stochastic step kernels for flow-matching samplers: one denoising step as a Gaussian action.

Every kernel in `STEP_KERNELS` samples the step without `prev_sample` and scores the given one
with it, through the same maths, so the rollout's log-prob and the trainer's agree. Latents are
`[B, ...]` of any modality, per-sample sigmas and noise levels broadcast, one generator per sample
allowed, all in float32. log_prob `[B]` is the per-dimension MEAN of the Gaussian log-density
(log-ratios stay ~1e-4 whatever the latent size); a deterministic step has log_prob 0.

    out = sde_step(model_output=v, sigma=s, sigma_next=s_next, sample=x, noise_level=0.7)

Not here: schedules and SDE windows (the rollout), guidance (the adapter), any model call.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional, Protocol, Sequence, Union

import torch
from torch import Tensor

from omni_rl.registry import Registry
from omni_rl.algos import latent_streams
from omni_rl.algos.latent_streams import LatentStreams

__all__ = [
    "StepOutput",
    "StepKernel",
    "STEP_KERNELS",
    "get_step_kernel",
    "check_step",
    "sde_step",
    "cps_step",
    "dance_sde_step",
    "ode_step",
    "per_sample",
    "expand_per_sample",
    "mean_over_sample_dims",
    "gaussian_log_prob",
    "step_latents",
]

Scalar = Union[float, Tensor]
GeneratorArg = Union[None, torch.Generator, Sequence[torch.Generator]]

# log sqrt(2 pi), the constant of the normalised Gaussian log-density.
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class StepOutput(NamedTuple):
    """One step's result. All float32.

    prev_sample: `[B, ...]` the next latent (sampled, or the given one cast to float32).
    log_prob:    `[B]` per-dimension mean Gaussian log-density of prev_sample (0 where std is 0).
    mean:        `[B, ...]` the transition mean (carries the graph of model_output).
    std:         `[B]` the transition std s.
    """

    prev_sample: Tensor
    log_prob: Tensor
    mean: Tensor
    std: Tensor


class StepKernel(Protocol):
    """The one signature every registered kernel has (see the module docstring)."""

    def __call__(
        self, *, model_output: Tensor, sigma: Scalar, sigma_next: Scalar, sample: Tensor,
        noise_level: Scalar, prev_sample: Optional[Tensor] = None, generator: GeneratorArg = None,
        validate: bool = True,
    ) -> StepOutput: ...


STEP_KERNELS: Registry[StepKernel] = Registry("SDE kernel")


def get_step_kernel(name: str) -> StepKernel:
    """The registered kernel called `name` (`sde`, `cps`, `dance_sde`, `ode`)."""
    return STEP_KERNELS.get(name)


# --------------------------------------------------------------------------------------------
# Shape helpers: per-sample scalars [B] against latents [B, ...] of any rank.
# --------------------------------------------------------------------------------------------


def per_sample(value: Scalar, *, batch: int, device: torch.device, name: str) -> Tensor:
    """`value` (python number, 0-d tensor or tensor `[batch]`) as a float32 tensor `[batch]`."""
    if isinstance(value, Tensor):
        if value.ndim == 0:
            return value.detach().to(device=device, dtype=torch.float32).expand(batch)
        if value.shape == (batch,):
            return value.detach().to(device=device, dtype=torch.float32)
        raise ValueError(
            f"{name} has shape {tuple(value.shape)}; expected a 0-d tensor, a python float or a "
            f"tensor of shape ({batch},) (one value per sample). Index or reshape it per sample."
        )
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return torch.full((batch,), float(value), device=device, dtype=torch.float32)
    raise TypeError(f"{name} must be a float or a tensor, got {type(value).__name__}")


def expand_per_sample(values: Tensor, like: Tensor) -> Tensor:
    """View a per-sample tensor `[B]` as `[B, 1, ..., 1]` so it broadcasts against `like` `[B, ...]`."""
    return values.reshape(values.shape[0], *([1] * (like.ndim - 1)))


def mean_over_sample_dims(x: Tensor) -> Tensor:
    """Mean over every non-batch dim: `[B, ...] -> [B]`."""
    return x.flatten(1).mean(dim=1)


def gaussian_log_prob(prev_sample: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Per-dimension mean of log N(prev_sample; mean, std^2): `[B, ...], [B, ...], [B] -> [B]`.

    `(1/D) sum_d [-(x_d - mu_d)^2 / (2 s^2)] - log s - log sqrt(2 pi)`; s is constant over the
    dims of one sample, so only the squared error needs averaging. Where s == 0 the result is 0
    (a deterministic step; see the module docstring). The denominator is made safe before the
    division so neither branch of the `where` produces inf/NaN (which would poison gradients).
    """
    stochastic = std > 0
    safe_std = torch.where(stochastic, std, torch.ones_like(std))
    sq_err = mean_over_sample_dims((prev_sample.detach() - mean) ** 2)
    log_prob = -sq_err / (2.0 * safe_std**2) - torch.log(safe_std) - _LOG_SQRT_2PI
    return torch.where(stochastic, log_prob, torch.zeros_like(log_prob))


# --------------------------------------------------------------------------------------------
# Shared plumbing: input checks, noise, sample-or-score.
# --------------------------------------------------------------------------------------------


def _as_fp32_latents(
    kernel: str, sample: Tensor, model_output: Tensor, prev_sample: Optional[Tensor]
) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    if sample.ndim < 2:
        raise ValueError(
            f"{kernel}: sample has shape {tuple(sample.shape)}; expected a batched latent [B, ...] "
            f"with at least one non-batch dim (e.g. [B, C, H, W]). Add the batch dim."
        )
    if model_output.shape != sample.shape:
        raise ValueError(
            f"{kernel}: model_output has shape {tuple(model_output.shape)} but sample has "
            f"{tuple(sample.shape)}; the velocity must match the latent's shape."
        )
    if prev_sample is not None and prev_sample.shape != sample.shape:
        raise ValueError(
            f"{kernel}: prev_sample has shape {tuple(prev_sample.shape)} but sample has "
            f"{tuple(sample.shape)}; pass the stored next latent of this very step."
        )
    x = sample.to(torch.float32)
    v = model_output.to(device=x.device, dtype=torch.float32)
    prev = None if prev_sample is None else prev_sample.to(device=x.device, dtype=torch.float32)
    return x, v, prev


def check_step(kernel: str, sigma: Tensor, sigma_next: Tensor, noise_level: Tensor) -> None:
    """Raise ValueError naming the first sample whose sigma / sigma_next / noise_level a stochastic
    kernel cannot take (tensors `[B]` or of any shape; one host sync when all are fine)."""
    # The stochastic kernels divide by sigma and by 1 - sigma (1 - sigma_next at sigma = 1) and
    # take sqrt(sigma - sigma_next): all finite exactly on 0 <= sigma_next < sigma <= 1.
    # NaN fails every comparison, so it is caught too. One host sync for both checks.
    bad_sigma = ~((sigma_next >= 0) & (sigma_next < sigma) & (sigma <= 1))
    bad_level = ~((noise_level >= 0) & torch.isfinite(noise_level))
    if not bool((bad_sigma | bad_level).any()):
        return
    if bool(bad_sigma.any()):
        i = int(bad_sigma.nonzero()[0, 0])
        raise ValueError(
            f"{kernel}: sample {i} has sigma={float(sigma[i])!r}, sigma_next={float(sigma_next[i])!r}; "
            f"expected 0 <= sigma_next < sigma <= 1 (a denoising step). Pass scheduler.sigmas[k] "
            f"and scheduler.sigmas[k + 1] of a FlowMatchEulerDiscreteScheduler."
        )
    i = int(bad_level.nonzero()[0, 0])
    raise ValueError(
        f"{kernel}: sample {i} has noise_level={float(noise_level[i])!r}; expected a finite "
        f"value >= 0 (0 = deterministic step, Flow-GRPO uses 0.7)."
    )


def _draw_noise(sample: Tensor, generator: GeneratorArg) -> Tensor:
    """Standard normal noise shaped like `sample`, float32, on the sample's device."""
    shape, device = sample.shape, sample.device
    if generator is None:
        return torch.randn(shape, device=device, dtype=torch.float32)
    if isinstance(generator, torch.Generator):
        noise = torch.randn(shape, generator=generator, device=generator.device, dtype=torch.float32)
        return noise.to(device)
    generators = list(generator)
    if len(generators) != shape[0]:
        raise ValueError(
            f"got {len(generators)} generators for a batch of {shape[0]} samples; pass one "
            f"torch.Generator per sample, a single generator, or None."
        )
    # Each sample draws from its own generator, so its noise is what it would get alone.
    return torch.stack(
        [torch.randn(shape[1:], generator=g, device=g.device, dtype=torch.float32).to(device)
         for g in generators]
    )


def _sample_or_score(
    mean: Tensor, std: Tensor, prev_sample: Optional[Tensor], generator: GeneratorArg
) -> StepOutput:
    if prev_sample is None:
        prev_sample = mean + expand_per_sample(std, mean) * _draw_noise(mean, generator)
    return StepOutput(prev_sample, gaussian_log_prob(prev_sample, mean, std), mean, std)


def _prepare(
    kernel: str, sample: Tensor, model_output: Tensor, prev_sample: Optional[Tensor],
    sigma: Scalar, sigma_next: Scalar, noise_level: Scalar, validate: bool = True,
) -> tuple[Tensor, Tensor, Optional[Tensor], Tensor, Tensor, Tensor]:
    """fp32 latents, and sigma, sigma_next, noise_level as `[B]` tensors, after the checks."""
    x, v, prev = _as_fp32_latents(kernel, sample, model_output, prev_sample)
    batch, device = x.shape[0], x.device
    sig = per_sample(sigma, batch=batch, device=device, name="sigma")
    sig_next = per_sample(sigma_next, batch=batch, device=device, name="sigma_next")
    level = per_sample(noise_level, batch=batch, device=device, name="noise_level")
    if validate:
        check_step(kernel, sig, sig_next, level)
    return x, v, prev, sig, sig_next, level


# --------------------------------------------------------------------------------------------
# The kernels.
# --------------------------------------------------------------------------------------------


@STEP_KERNELS.register("sde")
def sde_step(
    *, model_output: Tensor, sigma: Scalar, sigma_next: Scalar, sample: Tensor, noise_level: Scalar,
    prev_sample: Optional[Tensor] = None, generator: GeneratorArg = None, validate: bool = True,
) -> StepOutput:
    """Flow-GRPO's SDE step (arXiv 2505.05470): the reverse SDE with the flow ODE's marginals.

    With a = noise_level and dt = sigma_next - sigma < 0:

        std_t = a * sqrt(sigma / (1 - sigma))     (1 - sigma_next in the denominator at sigma = 1,
                                                   where 1 - sigma is 0)
        mean  = x (1 + std_t^2 / (2 sigma) dt) + v (1 + std_t^2 (1 - sigma) / (2 sigma)) dt
        s     = std_t sqrt(-dt)

    a = 0 gives mean = x + v dt, the Euler (ode) step, with s = 0.
    """
    x, v, prev, sig, sig_next, level = _prepare(
        "sde", sample, model_output, prev_sample, sigma, sigma_next, noise_level, validate
    )
    dt = sig_next - sig
    one_minus = torch.where(sig >= 1, 1 - sig_next, 1 - sig)
    std_t = level * torch.sqrt(sig / one_minus)
    # The drift of the marginal-preserving reverse SDE: the score term std_t^2/2 * grad log p,
    # with grad log p written through x and v for rectified flow, folded into x's and v's weights.
    half_var_over_sigma = expand_per_sample(std_t**2 / (2 * sig), x)
    dt_b = expand_per_sample(dt, x)
    one_minus_sig = expand_per_sample(1 - sig, x)
    mean = x * (1 + half_var_over_sigma * dt_b) + v * (1 + half_var_over_sigma * one_minus_sig) * dt_b
    std = std_t * torch.sqrt(-dt)
    return _sample_or_score(mean, std, prev, generator)


@STEP_KERNELS.register("cps")
def cps_step(
    *, model_output: Tensor, sigma: Scalar, sigma_next: Scalar, sample: Tensor, noise_level: Scalar,
    prev_sample: Optional[Tensor] = None, generator: GeneratorArg = None, validate: bool = True,
) -> StepOutput:
    """Coefficient-preserving sampling (Flow-CPS, arXiv 2509.05952).

    Re-noises the predicted clean latent so that the next latent keeps the coefficients
    (1 - sigma_next) on x_0 and sigma_next on the total noise, whatever the injected noise:

        s      = sigma_next * sin(a pi / 2)                  (a = noise_level)
        x0_hat = x - sigma v,   x1_hat = x + (1 - sigma) v
        mean   = x0_hat (1 - sigma_next) + x1_hat sqrt(sigma_next^2 - s^2)

    log_prob here is the PROPER normalised Gaussian log-density (per-dimension mean, module
    docstring). Upstream Flow-CPS code uses the unnormalised score -(prev - mean)^2 instead;
    the two differ by the factor 1/(2 s^2) and the -log s - log sqrt(2 pi) constant, so ratios
    and clip ranges tuned on upstream numbers do not carry over one-to-one.
    At sigma_next = 0 (the last step) s = 0: the step is deterministic and lands on x0_hat.
    """
    x, v, prev, sig, sig_next, level = _prepare(
        "cps", sample, model_output, prev_sample, sigma, sigma_next, noise_level, validate
    )
    std = sig_next * torch.sin(level * (math.pi / 2))
    sig_b = expand_per_sample(sig, x)
    x0_hat = x - sig_b * v
    x1_hat = x + (1 - sig_b) * v
    # clamp: sigma_next^2 - s^2 >= 0 in exact arithmetic (|sin| <= 1); rounding can dip below 0.
    noise_coef = torch.sqrt(torch.clamp(sig_next**2 - std**2, min=0.0))
    mean = x0_hat * expand_per_sample(1 - sig_next, x) + x1_hat * expand_per_sample(noise_coef, x)
    return _sample_or_score(mean, std, prev, generator)


@STEP_KERNELS.register("dance_sde")
def dance_sde_step(
    *, model_output: Tensor, sigma: Scalar, sigma_next: Scalar, sample: Tensor, noise_level: Scalar,
    prev_sample: Optional[Tensor] = None, generator: GeneratorArg = None, validate: bool = True,
) -> StepOutput:
    """DanceGRPO's SDE step (arXiv 2505.07818); `noise_level` plays DanceGRPO's constant eta.

        x0_hat = x - sigma v
        score  = -(x - (1 - sigma) x0_hat) / sigma^2          (estimate of grad log p_sigma(x))
        mean   = x + v dt - 0.5 eta^2 score dt                 (dt = sigma_next - sigma)
        s      = eta sqrt(sigma - sigma_next)

    Since score = -(x + (1 - sigma) v) / sigma, this equals the `sde` kernel with
    std_t = eta, i.e. Flow-GRPO's a = eta sqrt((1 - sigma) / sigma) (a test checks it).
    """
    x, v, prev, sig, sig_next, level = _prepare(
        "dance_sde", sample, model_output, prev_sample, sigma, sigma_next, noise_level, validate
    )
    dt = sig_next - sig
    sig_b = expand_per_sample(sig, x)
    dt_b = expand_per_sample(dt, x)
    x0_hat = x - sig_b * v
    score = -(x - (1 - sig_b) * x0_hat) / sig_b**2
    mean = x + v * dt_b - 0.5 * expand_per_sample(level**2, x) * score * dt_b
    std = level * torch.sqrt(-dt)
    return _sample_or_score(mean, std, prev, generator)


@STEP_KERNELS.register("ode")
def ode_step(
    *, model_output: Tensor, sigma: Scalar, sigma_next: Scalar, sample: Tensor, noise_level: Scalar,
    prev_sample: Optional[Tensor] = None, generator: GeneratorArg = None, validate: bool = True,
) -> StepOutput:
    """The Euler step of diffusers' FlowMatchEulerDiscreteScheduler: prev = x + (sigma_next - sigma) v.

    Deterministic: std = 0 and log_prob = 0 for every sample. `noise_level` and `generator` are
    accepted for the common signature and ignored; no noise is drawn. A given `prev_sample` is
    returned (as float32) unchecked. Sigmas are not range-checked: Euler is valid for any dt.
    """
    x, v, prev, sig, sig_next, _ = _prepare(
        "ode", sample, model_output, prev_sample, sigma, sigma_next, noise_level, validate=False
    )
    mean = x + expand_per_sample(sig_next - sig, x) * v
    std = torch.zeros_like(sig)
    return StepOutput(mean if prev is None else prev, torch.zeros_like(sig), mean, std)


def step_latents(kernel: StepKernel, *, model_output, sample, prev_sample=None, **kwargs) -> StepOutput:
    """`kernel` on latents of one stream (a tensor, passed through) or several (`LatentStreams`:
    flattened and concatenated per sample, one joint action; `prev_sample` and `mean` come back
    as streams, `log_prob` and `std` are `[B]`)."""
    if not isinstance(sample, LatentStreams):
        return kernel(model_output=model_output, sample=sample, prev_sample=prev_sample, **kwargs)
    out = kernel(
        model_output=latent_streams.flat(model_output),
        sample=latent_streams.flat(sample),
        prev_sample=None if prev_sample is None else latent_streams.flat(prev_sample),
        **kwargs,
    )
    return StepOutput(
        prev_sample=latent_streams.unflat(out.prev_sample, sample),
        log_prob=out.log_prob,
        mean=latent_streams.unflat(out.mean, sample),
        std=out.std,
    )

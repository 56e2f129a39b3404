"""Policy losses for diffusion RL, and the per-step KL forms to a reference policy.

Each loss is a `StepLoss` in `DIFFUSION_LOSSES`, built once from its `Options` (the recipe's
`algo.policy_loss_options`) and called with tensors only. An entry is a (sample, denoising step) pair
whose log-prob is `flow_sde`'s per-dimension mean (so clip ranges are ~1e-4); the loss is the
masked mean over entries, with advantages clamped and optional rollout-correction weights. The
KL forms (`DIFFUSION_KL`) are per-dimension means. Metrics: docs/algorithms.md (Loss metrics).

    loss, metrics = FlowGRPOLoss(clip_range=1e-4)(inp)      # inp: StepLossInput

Not here: the token losses, adding the KL with its coefficient (the family), choosing steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional, Union

import torch
from torch import Tensor

from omni_rl.algos.flow_sde import mean_over_sample_dims, per_sample
from omni_rl.option import ComponentOptions, option
from omni_rl.registry import Registry

__all__ = [
    "option",
    "AdvantageClipOptions",
    "ClippedStepOptions",
    "FlowDPPOOptions",
    "StepLossInput",
    "PolicyLoss",
    "StepLoss",
    "DIFFUSION_LOSSES",
    "get_diffusion_loss",
    "check_clip",
    "check_entries",
    "clipped_surrogate",
    "rollout_weighted",
    "FlowGRPOLoss",
    "FlowDPPOLoss",
    "GRPOGuardLoss",
    "guard_log_ratio",
    "DiffusionKL",
    "DIFFUSION_KL",
    "get_diffusion_kl",
    "flow_grpo_code_kl",
    "exact_kl",
]

Metrics = dict[str, Tensor]


@dataclass
class AdvantageClipOptions(ComponentOptions):
    """The option every policy loss has: the advantage clamp (a property of the advantage)."""

    adv_clip_max: float = option(5.0, "Advantages are clamped to [-adv_clip_max, adv_clip_max] (Flow-GRPO: 5).")

    def check(self) -> None:
        if not (math.isfinite(self.adv_clip_max) and self.adv_clip_max > 0):
            raise ValueError(f"adv_clip_max={self.adv_clip_max!r}: expected a finite value > 0 (Flow-GRPO uses 5)")


@dataclass
class ClippedStepOptions(AdvantageClipOptions):
    """A clipped step loss's options: the ratio is clipped to [1 - clip_range, 1 + clip_range_high]."""

    clip_range: float = option(1e-4, "Lower ratio clip: [1 - clip_range, ...] (Flow-GRPO: 1e-4; step log-ratios are ~1e-4).")
    clip_range_high: Optional[float] = option(None, "Upper ratio clip; null = clip_range (symmetric).")

    @property
    def clip_low(self) -> float:
        return self.clip_range

    @property
    def clip_high(self) -> float:
        return self.clip_range if self.clip_range_high is None else self.clip_range_high

    def check(self) -> None:
        super().check()
        check_clip(self.clip_range, self.clip_range_high)


@dataclass
class FlowDPPOOptions(AdvantageClipOptions):
    """Flow-DPPO's options: the per-step KL trust region (no ratio clip)."""

    kl_threshold: float = option(1e-5, "The trust region tau on the per-step KL to the old policy (Flow-DPPO: 1e-5).")

    def check(self) -> None:
        super().check()
        if not (math.isfinite(self.kl_threshold) and self.kl_threshold >= 0):
            raise ValueError(f"kl_threshold={self.kl_threshold!r}: expected a finite value >= 0 (Flow-DPPO uses 1e-5)")


def check_clip(clip_range: float, clip_range_high: Optional[float]) -> None:
    """The ratio clip's range: 0 < clip_range < 1 and clip_range_high > 0 (or None)."""
    if not 0 < clip_range < 1:
        raise ValueError(f"clip_range={clip_range!r}: expected 0 < clip_range < 1 (Flow-GRPO: 1e-4, PPO: 0.2)")
    if clip_range_high is not None and not clip_range_high > 0:
        raise ValueError(f"clip_range_high={clip_range_high!r}: expected > 0, or null for clip_range")


def check_entries(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Optional[Tensor],
                  rollout_is_weight: Optional[Tensor]) -> None:
    """The shape rules every loss input keeps: E entries of log_prob, old_log_prob and mask,
    advantages and weights that broadcast to them."""
    shape = tuple(log_prob.shape)
    if log_prob.numel() == 0:
        raise ValueError("log_prob is empty; a policy loss needs at least one entry")
    if tuple(old_log_prob.shape) != shape:
        raise ValueError(
            f"old_log_prob has shape {tuple(old_log_prob.shape)} but log_prob has {shape}; "
            f"they must describe the same entries."
        )
    if not _broadcasts(advantages, shape):
        raise ValueError(
            f"advantages of shape {tuple(advantages.shape)} do not broadcast to log_prob's "
            f"{shape}; for token log-probs [B, T] pass advantages[:, None]."
        )
    if rollout_is_weight is not None and not _broadcasts(rollout_is_weight, shape):
        raise ValueError(
            f"rollout_is_weight has shape {tuple(rollout_is_weight.shape)}, which does not broadcast "
            f"to log_prob's {shape}; pass one weight per entry (rollout_correction.rollout_is_weights)"
        )
    if mask is not None and tuple(mask.shape) != shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}; expected log_prob's shape {shape}")


@dataclass
class StepLossInput:
    """The tensors of a step loss: E = B entries, one per (sample, denoising step) pair.

    log_prob:      `[B]` the current policy's log-probs (carries the graph).
    old_log_prob:  `[B]` the behaviour policy's log-probs (rollout or recompute).
    advantages:    broadcastable to `[B]`.
    mask:          optional `[B]`, 1 where the entry counts.
    mean:          `[B, ...]` the current policy's transition means (carries the graph).
    old_mean:      `[B, ...]` the behaviour policy's transition means (losses with `reads_old_mean`).
    std:           `[B]` (or a scalar) the transition std s of each step (`StepOutput.std`).
    dt:            `[B]` or a float, sigma_next - sigma (< 0) of each step.
    rollout_is_weight: optional, broadcastable to `[B]`, >= 0, a constant: each entry's policy term
                   is multiplied by it before the mean (the rollout correction); None leaves the
                   loss exactly as without it.
    std_checked:   True when std comes from a step kernel on checked sigmas (so >= 0): the
                   diffusion losses skip their host-side check of it (a device sync per step).
    """

    log_prob: Tensor
    old_log_prob: Tensor
    advantages: Tensor
    mask: Optional[Tensor] = None
    mean: Optional[Tensor] = None
    old_mean: Optional[Tensor] = None
    std: Optional[Union[Tensor, float]] = None
    dt: Optional[Union[Tensor, float]] = None
    rollout_is_weight: Optional[Tensor] = None
    # `[B, ...]` a frozen teacher's transition means at the same states (losses with
    # `reads_teacher_mean`: on-policy distillation, `omni_rl.algos.distill`).
    teacher_mean: Optional[Tensor] = None
    # True when `std` is a step kernel's output on checked sigmas and noise levels (>= 0 by
    # construction): the diffusion losses then skip their host-side check of it, which on an
    # accelerator would wait for the device on every step.
    std_checked: bool = False

    def __post_init__(self) -> None:
        check_entries(self.log_prob, self.old_log_prob, self.advantages, self.mask, self.rollout_is_weight)


class PolicyLoss:
    """A policy loss: its knobs bound once, its input tensors only.

    `Loss(options)` or `Loss(**knobs)` builds `Options` (a dataclass) and checks it once;
    `loss(inp)` returns (loss: 0-d tensor, metrics: dict of 0-d detached tensors). What a loss
    reads beyond the common tensors is a declared class attribute (`reads_old_mean` here), so a
    caller asks the class, never a function attribute."""

    Options: ClassVar[type] = AdvantageClipOptions

    def __init__(self, options=None, /, **knobs):
        if options is not None and knobs:
            raise TypeError(f"{type(self).__name__}: pass an options instance or keyword options, not both")
        self.options = options if options is not None else self.Options(**knobs)
        if not isinstance(self.options, self.Options):
            raise TypeError(f"{type(self).__name__} takes {self.Options.__name__}, got {type(self.options).__name__}")
        self.options.check()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"


class StepLoss(PolicyLoss):
    """A diffusion step loss (`DIFFUSION_LOSSES`), called with a `StepLossInput`."""

    # Whether it reads `StepLossInput.old_mean`: the trainer then has the behaviour policy's
    # transition means computed (the rollout records log-probs only), and skips that forward otherwise.
    reads_old_mean: ClassVar[bool] = False
    # Whether it reads `StepLossInput.teacher_mean`: the family then needs `algo.teachers` and
    # has them score every trained step.
    reads_teacher_mean: ClassVar[bool] = False

    def __call__(self, inp: StepLossInput) -> tuple[Tensor, Metrics]:
        raise NotImplementedError


def _broadcasts(x: Tensor, shape: tuple[int, ...]) -> bool:
    try:
        return torch.broadcast_shapes(tuple(x.shape), shape) == shape
    except RuntimeError:
        return False


DiffusionKL = Callable[..., Tensor]

DIFFUSION_LOSSES: Registry[type[StepLoss]] = Registry("diffusion loss")
DIFFUSION_KL: Registry[DiffusionKL] = Registry("diffusion KL form")


def get_diffusion_loss(name: str) -> type[StepLoss]:
    """The registered diffusion loss class called `name` (`flow_grpo`, `flow_dppo`, `grpo_guard`)."""
    return DIFFUSION_LOSSES.get(name)


def get_diffusion_kl(name: str) -> DiffusionKL:
    """The registered KL form called `name` (`flow_grpo_code`, `exact`)."""
    return DIFFUSION_KL.get(name)


# --------------------------------------------------------------------------------------------
# KL forms between one step's Gaussians N(mean, s^2 I) and N(ref_mean, s^2 I).
# --------------------------------------------------------------------------------------------


def _sq_dist_over_var(mean: Tensor, ref_mean: Tensor, std: Union[Tensor, float], name: str,
                      std_checked: bool = False) -> Tensor:
    """mean_d (mean - ref_mean)^2 / (2 s^2) per sample `[B]`, 0 where s == 0."""
    if mean.ndim < 2 or mean.shape != ref_mean.shape:
        raise ValueError(
            f"{name}: mean {tuple(mean.shape)} and ref_mean {tuple(ref_mean.shape)} must be latents "
            f"of one shape [B, ...]; pass StepOutput.mean of the policy and of the reference."
        )
    s = per_sample(std, batch=mean.shape[0], device=mean.device, name="std")
    if not std_checked and bool((s < 0).any()):
        raise ValueError(f"{name}: std has negative entries {s[s < 0].tolist()}; pass StepOutput.std (>= 0)")
    stochastic = s > 0
    safe_s = torch.where(stochastic, s, torch.ones_like(s))
    sq = mean_over_sample_dims((mean.to(torch.float32) - ref_mean.detach().to(torch.float32)) ** 2)
    return torch.where(stochastic, sq / (2 * safe_s**2), torch.zeros_like(sq))


def _neg_dt(dt: Union[Tensor, float, None], batch: int, device: torch.device, name: str) -> Tensor:
    if dt is None:
        raise ValueError(f"{name} needs dt (sigma_next - sigma per step) but dt is None; pass it")
    neg_dt = -per_sample(dt, batch=batch, device=device, name="dt")
    if bool((neg_dt < 0).any()):
        raise ValueError(
            f"{name}: dt has positive entries {(-neg_dt[neg_dt < 0]).tolist()}; expected "
            f"dt = sigma_next - sigma <= 0 (denoising runs from sigma 1 towards 0)."
        )
    return neg_dt


@DIFFUSION_KL.register("exact")
def exact_kl(
    mean: Tensor, ref_mean: Tensor, std: Union[Tensor, float], dt: Union[Tensor, float, None] = None
) -> Tensor:
    """The exact per-step KL between equal-std Gaussians, per dimension: `[B]`.

    KL(N(mu, s^2) || N(mu_ref, s^2)) per dim = (mu - mu_ref)^2 / (2 s^2); averaged over the
    non-batch dims. With s = std_t sqrt(-dt) this is mean_d (mu - mu_ref)^2 / (2 std_t^2 (-dt)),
    the Flow-GRPO paper's per-step KL. `dt` is not needed (accepted for the common signature).
    0 where std is 0.
    """
    return _sq_dist_over_var(mean, ref_mean, std, "exact KL")


@DIFFUSION_KL.register("flow_grpo_code")
def flow_grpo_code_kl(
    mean: Tensor, ref_mean: Tensor, std: Union[Tensor, float], dt: Union[Tensor, float, None]
) -> Tensor:
    """Flow-GRPO's code form: mean_d (mu - mu_ref)^2 / (2 std_t^2), std_t = std / sqrt(-dt): `[B]`.

    It is the exact KL times (-dt): it leaves out the 1/(-dt) that the transition variance
    s^2 = std_t^2 (-dt) carries, so late (small-dt) steps are not up-weighted. Computed as
    (-dt) * exact_kl so a dt of 0 gives 0, not 0/0. 0 where std is 0.
    """
    kl = exact_kl(mean, ref_mean, std)
    return _neg_dt(dt, mean.shape[0], mean.device, "flow_grpo_code KL") * kl


# --------------------------------------------------------------------------------------------
# Shared pieces of the losses.
# --------------------------------------------------------------------------------------------


def _masked_mean(x: Tensor, mask: Optional[Tensor]) -> Tensor:
    if mask is None:
        return x.mean()
    # where() rather than x * mask: an inf/NaN in a masked-out entry must not leak in.
    return torch.where(mask > 0, x * mask, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1.0)


def _prepare(inp: StepLossInput, adv_clip_max: float) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """(log_prob, old_log_prob, clamped advantages broadcast to log_prob, mask), all fp32."""
    log_prob = inp.log_prob.to(torch.float32)
    old = inp.old_log_prob.detach().to(device=log_prob.device, dtype=torch.float32)
    adv = inp.advantages.detach().to(device=log_prob.device, dtype=torch.float32)
    adv = torch.clamp(adv, -adv_clip_max, adv_clip_max).expand_as(log_prob)
    mask = None if inp.mask is None else inp.mask.detach().to(device=log_prob.device, dtype=torch.float32)
    return log_prob, old, adv, mask


def rollout_weighted(per_entry: Tensor, weight: Optional[Tensor]) -> Tensor:
    """Each entry's policy term times its rollout-correction weight (`rollout_is_weight`); the
    terms themselves when there is none. Shared by the diffusion and the token losses."""
    if weight is None:
        return per_entry
    return per_entry * weight.detach().to(device=per_entry.device, dtype=per_entry.dtype)


def clipped_surrogate(ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float) -> Tensor:
    """PPO's pessimistic per-entry loss max(-A rho, -A clip(rho, 1 - lo, 1 + hi))."""
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    return torch.maximum(-adv * ratio, -adv * clipped)


def _ratio_metrics(ratio: Tensor, log_ratio: Tensor, mask: Optional[Tensor]) -> Metrics:
    ratio, log_ratio = ratio.detach(), log_ratio.detach()
    ratio_mean = _masked_mean(ratio, mask)
    counted = torch.ones_like(ratio, dtype=torch.bool) if mask is None else mask > 0
    abs_dev = torch.where(counted, (ratio - 1).abs(), torch.zeros_like(ratio))
    return {
        "approx_kl": 0.5 * _masked_mean(log_ratio**2, mask),
        "ratio_mean": ratio_mean,
        "ratio_std": _masked_mean((ratio - ratio_mean) ** 2, mask).sqrt(),
        "ratio_max_abs_dev": abs_dev.max(),
    }


def _clipfrac(ratio: Tensor, mask: Optional[Tensor], options: ClippedStepOptions) -> Tensor:
    # The ratio left the trust region. The gradient is zeroed only where, in addition, the sign of
    # A makes the clipped branch the max; the metric follows Flow-GRPO's |rho - 1| > eps form.
    outside = (ratio.detach() < 1 - options.clip_low) | (ratio.detach() > 1 + options.clip_high)
    return _masked_mean(outside.to(torch.float32), mask)


def _diffusion_extras(inp: StepLossInput, loss: str) -> tuple[Tensor, Tensor, Tensor]:
    """(mean fp32 [B, ...], old_mean fp32 [B, ...], std fp32 [B]) after the checks."""
    missing = [name for name in ("mean", "old_mean", "std") if getattr(inp, name) is None]
    if missing:
        raise ValueError(
            f"policy loss {loss!r} needs {', '.join(missing)} (the transition means of the current "
            f"and the rollout policy and the step std: StepOutput.mean / .std); they are None. "
            f"Store them in the rollout and pass them in StepLossInput."
        )
    mean, old_mean = inp.mean, inp.old_mean
    if mean.ndim < 2 or mean.shape != old_mean.shape:
        raise ValueError(
            f"policy loss {loss!r}: mean {tuple(mean.shape)} and old_mean {tuple(old_mean.shape)} must be "
            f"latents of one shape [B, ...]"
        )
    batch = mean.shape[0]
    if tuple(inp.log_prob.shape) != (batch,):
        raise ValueError(
            f"policy loss {loss!r} scores one entry per (sample, step): log_prob has shape "
            f"{tuple(inp.log_prob.shape)}, expected ({batch},) to match mean's batch."
        )
    std = per_sample(inp.std, batch=batch, device=inp.log_prob.device, name="std")
    if not inp.std_checked and bool((std < 0).any()):
        raise ValueError(
            f"policy loss {loss!r}: std has negative entries {std[std < 0].tolist()}; expected >= 0 "
            f"(pass StepOutput.std)"
        )
    mean = mean.to(device=inp.log_prob.device, dtype=torch.float32)
    old_mean = old_mean.detach().to(device=inp.log_prob.device, dtype=torch.float32)
    return mean, old_mean, std


# --------------------------------------------------------------------------------------------
# The losses.
# --------------------------------------------------------------------------------------------


@DIFFUSION_LOSSES.register("flow_grpo")
class FlowGRPOLoss(StepLoss):
    """Flow-GRPO / DanceGRPO clipped surrogate (arXiv 2505.05470).

        A   = clamp(advantages, -adv_clip_max, adv_clip_max)
        rho = exp(log_prob - old_log_prob)
        loss = mean( max(-A rho, -A clip(rho, 1 - clip_range, 1 + clip_range_high)) )

    On-policy (log_prob == old_log_prob) rho is exactly 1 and d loss / d log_prob_i = -A_i / E.
    """

    Options = ClippedStepOptions

    def __call__(self, inp: StepLossInput) -> tuple[Tensor, Metrics]:
        o = self.options
        log_prob, old, adv, mask = _prepare(inp, o.adv_clip_max)
        log_ratio = log_prob - old
        ratio = torch.exp(log_ratio)
        per_entry = clipped_surrogate(ratio, adv, o.clip_low, o.clip_high)
        loss = _masked_mean(rollout_weighted(per_entry, inp.rollout_is_weight), mask)
        metrics = _ratio_metrics(ratio, log_ratio, mask)
        metrics["clipfrac"] = _clipfrac(ratio, mask, o)
        metrics["policy_loss"] = loss.detach()
        return loss, metrics


@DIFFUSION_LOSSES.register("flow_dppo")
class FlowDPPOLoss(StepLoss):
    """Flow-DPPO (arXiv 2606.11025): an unclipped surrogate with a per-step KL trust region.

        D_i  = mean_d (mean_i - old_mean_i)^2 / (2 s_i^2)     (the exact per-step KL, `exact_kl`)
        drop = D_i >= kl_threshold  and  (rho_i > 1, A_i > 0  or  rho_i < 1, A_i < 0)
        loss = mean( -A rho * (1 - drop) )

    A term is dropped only when its step already left the trust region AND following its
    gradient would move it further out; terms that pull back towards the old policy stay.
    D and the drop decision carry no gradient. Dropped entries still count in the mean's
    denominator (their contribution is 0).
    """

    Options = FlowDPPOOptions
    reads_old_mean = True

    def __call__(self, inp: StepLossInput) -> tuple[Tensor, Metrics]:
        mean, old_mean, std = _diffusion_extras(inp, "flow_dppo")
        log_prob, old, adv, mask = _prepare(inp, self.options.adv_clip_max)
        log_ratio = log_prob - old
        ratio = torch.exp(log_ratio)
        # exact_kl's value; std was checked by _diffusion_extras already (no second host sync).
        divergence = _sq_dist_over_var(mean.detach(), old_mean, std, "flow_dppo", std_checked=True)
        pushes_further = ((ratio > 1) & (adv > 0)) | ((ratio < 1) & (adv < 0))
        drop = (divergence >= self.options.kl_threshold) & pushes_further
        per_entry = torch.where(drop, torch.zeros_like(ratio), -adv * ratio)
        loss = _masked_mean(rollout_weighted(per_entry, inp.rollout_is_weight), mask)
        metrics = _ratio_metrics(ratio, log_ratio, mask)
        metrics["dropfrac"] = _masked_mean(drop.to(torch.float32), mask)
        metrics["policy_loss"] = loss.detach()
        return loss, metrics


def guard_log_ratio(
    log_prob: Tensor, old_log_prob: Tensor, mean: Tensor, old_mean: Tensor, std: Tensor
) -> Tensor:
    """GRPO-Guard's normalised log-ratio `[B]`: s (logp - old) + mean_d (mean - old_mean)^2 / (2 s).

    0 where s == 0. `log_prob`, `old_log_prob`, `std`: `[B]`; `mean`, `old_mean`: `[B, ...]`.
    See `GRPOGuardLoss` for why this equals mean_d(eps * (mean - old_mean)).
    """
    stochastic = std > 0
    safe_std = torch.where(stochastic, std, torch.ones_like(std))
    sq_shift = mean_over_sample_dims((mean - old_mean.detach()) ** 2)
    log_ratio = std * (log_prob - old_log_prob.detach()) + sq_shift / (2 * safe_std)
    return torch.where(stochastic, log_ratio, torch.zeros_like(log_ratio))


@DIFFUSION_LOSSES.register("grpo_guard")
class GRPOGuardLoss(StepLoss):
    """GRPO-Guard (arXiv 2510.22319): a re-centred ratio, the clipped loss, 1/|dt| step weights.

    1. Ratio normalisation. With s the transition std,
           log rho = s (log_prob - old_log_prob) + mean_d (mean - old_mean)^2 / (2 s).
       Since log_prob is the per-dim mean of -(prev - mu)^2 / (2 s^2) + const and
       prev = old_mean + s eps, this is exactly mean_d(eps * (mean - old_mean)): its mean under
       the rollout noise is 0 (Flow-GRPO's plain ratio is biased below 1 by -D) and its scale
       no longer carries 1/s, which differs wildly across steps. So clipping bites evenly.
       Where s == 0 log rho is 0.
    2. The clipped surrogate of flow_grpo on that ratio.
    3. Gradient reweighting: d log rho / d theta scales like dt (the velocity enters the mean
       times dt), so each entry's loss is multiplied by w = 1 / (-dt), unnormalised, making every
       step's gradient O(1). Entries with dt == 0 (no step) get w = 0. The weight is not
       normalised over the batch, so micro-batches holding one step each still differ in weight.

    Needs mean, old_mean, std and dt.
    """

    Options = ClippedStepOptions
    reads_old_mean = True

    def __call__(self, inp: StepLossInput) -> tuple[Tensor, Metrics]:
        o = self.options
        mean, old_mean, std = _diffusion_extras(inp, "grpo_guard")
        log_prob, old, adv, mask = _prepare(inp, o.adv_clip_max)
        neg_dt = _neg_dt(inp.dt, mean.shape[0], log_prob.device, "policy loss 'grpo_guard'")
        ratio = torch.exp(guard_log_ratio(log_prob, old, mean, old_mean, std))
        stepped = neg_dt > 0
        safe_neg_dt = torch.where(stepped, neg_dt, torch.ones_like(neg_dt))
        weight = torch.where(stepped, 1 / safe_neg_dt, torch.zeros_like(neg_dt))
        per_entry = weight * clipped_surrogate(ratio, adv, o.clip_low, o.clip_high)
        loss = _masked_mean(rollout_weighted(per_entry, inp.rollout_is_weight), mask)
        metrics = _ratio_metrics(ratio, log_prob - old, mask)
        metrics["clipfrac"] = _clipfrac(ratio, mask, o)
        metrics["policy_loss"] = loss.detach()
        return loss, metrics

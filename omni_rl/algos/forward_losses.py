"""Forward-process diffusion losses: DiffusionNFT and Diffusion-DPO on flow-matching targets.

No log-probs, no SDE: they noise clean latents x0 again, x_t = (1 - t) x0 + t eps, and compare the
model's velocity v with the flow target u = eps - x0 (per-dimension means, fp32, all but `velocity`
detached). Each is a `ForwardLoss` in `FORWARD_LOSSES` declaring what it reads (`reads`) and
whether its rows are pairs (`pairwise`); docs/algorithms.md lists their metrics.

- `diffusion_nft`: r = clamp(A / (2 adv_clip_max) + 0.5, 0, 1), v+ = b v + (1 - b) v_old,
  v- = (1 + b) v_old - b v, loss = mean_i [r_i e+_i + (1 - r_i) e-_i] with, per `weighting`,
  "velocity": e+- = mean_d (v+- - u)^2; "adaptive_x0": the x0-space error of x_t - t v+- against
  x0 divided by sg(mean_d |x_t - t v - x0|) (floored), so that every t weighs alike.
- `diffusion_dpo`: rows are winners then losers, pair i sharing t and eps; with err = mean_d
  (v - u)^2 and ref the same for the reference, z = -beta / 2 [(err_w - ref_w) - (err_l - ref_l)],
  loss = mean over pairs of -log sigmoid(z).

Not here: drawing t and eps, the EMA of the old policy, choosing pairs (`omni_rl.families`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import Tensor

from omni_rl.algos.flow_sde import mean_over_sample_dims
from omni_rl.algos.policy_losses import AdvantageClipOptions, PolicyLoss
from omni_rl.option import ComponentOptions, option
from omni_rl.registry import Registry

__all__ = [
    "ForwardLossInput",
    "ForwardLoss",
    "FORWARD_LOSSES",
    "NFT_WEIGHTINGS",
    "nft_optimality",
    "DiffusionNFTOptions",
    "DiffusionDPOOptions",
    "DiffusionNFTLoss",
    "DiffusionDPOLoss",
]

Metrics = dict[str, Tensor]
NFT_WEIGHTINGS = ("velocity", "adaptive_x0")
_ADAPTIVE_FLOOR = 1e-5


@dataclass
class DiffusionNFTOptions(AdvantageClipOptions):
    """DiffusionNFT's options (arXiv 2509.16117)."""

    beta: float = option(1.0, "Guidance strength b of the implicit policies v+- (the paper: 1).")
    weighting: str = option("velocity", f"The per-sample error: {' or '.join(NFT_WEIGHTINGS)} (module docstring).")
    ema_decay: float = option(0.9, "The old policy v_old is an EMA of the weights, ema <- d ema + (1 - d) theta "
                                   "after every optimizer step; d in [0, 1).")

    def check(self) -> None:
        super().check()
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"beta={self.beta!r}: expected a finite value > 0 (DiffusionNFT: 1)")
        if self.weighting not in NFT_WEIGHTINGS:
            raise ValueError(f"weighting={self.weighting!r}: expected one of {', '.join(NFT_WEIGHTINGS)}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay={self.ema_decay!r}: expected in [0, 1) (0: the old policy is the weights "
                             f"as of the last optimizer step)")


@dataclass
class DiffusionDPOOptions(ComponentOptions):
    """Diffusion-DPO's options (arXiv 2311.12908, on flow targets)."""

    beta: float = option(5000.0, "beta of -log sigmoid(-beta/2 [...]) on per-dimension mean errors "
                                 "(Wallace et al. use 5000 for SD1.5 with theirs).")

    def check(self) -> None:
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"beta={self.beta!r}: expected a finite value > 0 (Diffusion-DPO: 5000)")


@dataclass
class ForwardLossInput:
    """The tensors of a forward-process loss. B entries, latents `[B, ...]`, per-entry values `[B]`.

    velocity:      the current policy's velocity at (x_t, t) (carries the graph).
    target:        u = eps - x0, the flow-matching target.
    timesteps:     t `[B]` in (0, 1).
    noisy:         x_t (read by DiffusionNFT's weighting "adaptive_x0").
    clean:         x0 (read by DiffusionNFT's weighting "adaptive_x0").
    old_velocity:  the old (EMA) policy's velocity at the same (x_t, t) (`reads` "old_velocity").
    advantages:    `[B]` group advantages A (`reads` "advantages").
    ref_velocity:  the reference (base) policy's velocity at the same (x_t, t) (`reads` "ref_velocity").
    """

    velocity: Tensor
    target: Tensor
    timesteps: Tensor
    noisy: Optional[Tensor] = None
    clean: Optional[Tensor] = None
    old_velocity: Optional[Tensor] = None
    advantages: Optional[Tensor] = None
    ref_velocity: Optional[Tensor] = None

    def __post_init__(self) -> None:
        shape = tuple(self.velocity.shape)
        if self.velocity.ndim < 2 or self.velocity.shape[0] == 0:
            raise ValueError(f"velocity has shape {shape}; expected latents [B, ...] with B >= 1")
        for name in ("target", "noisy", "clean", "old_velocity", "ref_velocity"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}; expected velocity's {shape} (the same draws)")
        batch = shape[0]
        for name in ("timesteps", "advantages"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (batch,):
                raise ValueError(f"{name} has shape {tuple(value.shape)}; expected ({batch},), one per entry")


class ForwardLoss(PolicyLoss):
    """A forward-process loss (`FORWARD_LOSSES`), called with a `ForwardLossInput`.

    `reads`: the `ForwardLossInput` fields its caller must fill beyond the common ones
    (`old_velocity`, `advantages`, `ref_velocity`); `pairwise`: its rows are (winner, loser) pairs."""

    Options: ClassVar[type] = DiffusionDPOOptions
    reads: ClassVar[frozenset[str]] = frozenset()
    pairwise: ClassVar[bool] = False

    def __call__(self, inp: ForwardLossInput) -> tuple[Tensor, Metrics]:
        raise NotImplementedError


FORWARD_LOSSES: Registry[type[ForwardLoss]] = Registry("forward-process diffusion loss")


def _f32(x: Tensor, like: Tensor) -> Tensor:
    return x.detach().to(device=like.device, dtype=torch.float32)


def _needs(inp: ForwardLossInput, loss: str, *names: str) -> None:
    missing = [n for n in names if getattr(inp, n) is None]
    if missing:
        raise ValueError(f"forward loss {loss!r} needs {', '.join(missing)} in ForwardLossInput; they are None")


def nft_optimality(advantages: Tensor, adv_clip_max: float) -> Tensor:
    """DiffusionNFT's optimality probability r = clamp(A / (2 adv_clip_max) + 0.5, 0, 1) `[B]`:
    0.5 for A = 0, 1 at A >= adv_clip_max, 0 at A <= -adv_clip_max."""
    return torch.clamp(advantages.to(torch.float32) / (2 * adv_clip_max) + 0.5, 0.0, 1.0)


@FORWARD_LOSSES.register("diffusion_nft")
class DiffusionNFTLoss(ForwardLoss):
    """DiffusionNFT (arXiv 2509.16117): mean_i [r_i e+_i + (1 - r_i) e-_i] (module docstring).

    With v_old == v (the first update after the EMA was set to the weights) v+ = v- = v, so the
    loss is mean_d (v - u)^2 and its gradient per sample is 2 b (2 r - 1) (v - u) / D: a sample
    better than its group (r > 1/2) is pulled towards its flow target, a worse one pushed away.
    """

    Options = DiffusionNFTOptions
    reads = frozenset({"old_velocity", "advantages"})

    def __call__(self, inp: ForwardLossInput) -> tuple[Tensor, Metrics]:
        return _nft(inp, self.options)


def _nft(inp: ForwardLossInput, o: DiffusionNFTOptions) -> tuple[Tensor, Metrics]:
    _needs(inp, "diffusion_nft", "old_velocity", "advantages")
    v = inp.velocity.to(torch.float32)
    v_old, u = _f32(inp.old_velocity, v), _f32(inp.target, v)
    b = o.beta
    r = nft_optimality(_f32(inp.advantages, v), o.adv_clip_max)
    v_pos = b * v + (1 - b) * v_old
    v_neg = (1 + b) * v_old - b * v
    if o.weighting == "velocity":
        e_pos = mean_over_sample_dims((v_pos - u) ** 2)
        e_neg = mean_over_sample_dims((v_neg - u) ** 2)
    else:
        _needs(inp, "diffusion_nft (weighting=adaptive_x0)", "noisy", "clean")
        x_t, x0 = _f32(inp.noisy, v), _f32(inp.clean, v)
        t = _f32(inp.timesteps, v).reshape(-1, *([1] * (v.ndim - 1)))
        scale = mean_over_sample_dims((x_t - t * v.detach() - x0).abs()).clamp(min=_ADAPTIVE_FLOOR)
        e_pos = mean_over_sample_dims((x_t - t * v_pos - x0) ** 2) / scale
        e_neg = mean_over_sample_dims((x_t - t * v_neg - x0) ** 2) / scale
    loss = (r * e_pos + (1 - r) * e_neg).mean()
    metrics = {
        "policy_loss": loss.detach(),
        "nft_positive": e_pos.detach().mean(),
        "nft_negative": e_neg.detach().mean(),
        "nft_r_mean": r.mean(),
        "nft_old_gap": mean_over_sample_dims((v.detach() - v_old) ** 2).mean(),
    }
    return loss, metrics


@FORWARD_LOSSES.register("diffusion_dpo")
class DiffusionDPOLoss(ForwardLoss):
    """Diffusion-DPO (arXiv 2311.12908) on flow targets: winners are the first half of the rows,
    losers the second (module docstring).

    d loss / d err_w = (beta / 2) sigmoid(-z) / P and d loss / d err_l = -(beta / 2) sigmoid(-z) / P:
    the winner's error is pushed down, the loser's up, most strongly where the policy still
    prefers the loser (z < 0). With the policy equal to the reference z = 0 and the loss is log 2.
    """

    Options = DiffusionDPOOptions
    reads = frozenset({"ref_velocity"})
    pairwise = True

    def __call__(self, inp: ForwardLossInput) -> tuple[Tensor, Metrics]:
        return _dpo(inp, self.options)


def _dpo(inp: ForwardLossInput, o: DiffusionDPOOptions) -> tuple[Tensor, Metrics]:
    _needs(inp, "diffusion_dpo", "ref_velocity")
    rows = inp.velocity.shape[0]
    if rows % 2:
        raise ValueError(
            f"diffusion_dpo scores pairs: {rows} rows; expected an even count (winners first, then their losers)"
        )
    v = inp.velocity.to(torch.float32)
    u, v_ref = _f32(inp.target, v), _f32(inp.ref_velocity, v)
    err = mean_over_sample_dims((v - u) ** 2)
    ref = mean_over_sample_dims((v_ref - u) ** 2)
    pairs = rows // 2
    gap_w = err[:pairs] - ref[:pairs]
    gap_l = err[pairs:] - ref[pairs:]
    z = -0.5 * o.beta * (gap_w - gap_l)
    loss = torch.nn.functional.softplus(-z).mean()  # -log sigmoid(z), stable for large |z|
    metrics = {
        "policy_loss": loss.detach(),
        "dpo_accuracy": (gap_w.detach() < gap_l.detach()).to(torch.float32).mean(),
        "dpo_margin": (gap_l - gap_w).detach().mean(),
        "dpo_err_winner": err[:pairs].detach().mean(),
        "dpo_err_loser": err[pairs:].detach().mean(),
        "dpo_pairs": torch.tensor(float(pairs)),
    }
    return loss, metrics

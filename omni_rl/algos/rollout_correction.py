"""Rollout correction: truncated importance weights between the rollout engine and the trainer.

TIS (Yao et al. 2025): w = min(exp(old_log_prob - rollout_log_prob), C), detached, per `token`,
`step` or `sequence`, truncated or masked at C (docs/algorithms.md, Rollout correction).

    weights, metrics = rollout_is_weights(old, rollout, mask, level="token", cap=2.0)

Not here: deciding whether weights are needed (the trainer), applying them (each loss).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from omni_rl.option import ComponentOptions

__all__ = ["ROLLOUT_IS_LEVELS", "ROLLOUT_IS_MODES", "RolloutCorrectionOptions", "rollout_is_weights"]

# "none" turns the correction off; which of the others a model takes, its family says.
ROLLOUT_IS_LEVELS = ("none", "token", "sequence", "step")
ROLLOUT_IS_MODES = ("truncate", "mask")


@dataclass
class RolloutCorrectionOptions(ComponentOptions):
    """The rollout correction's options (`algo.rollout_correction_options`). It needs the trainer's own
    old log-probs (algo.old_logprob_mode auto or recompute); where they are the rollout's (auto,
    the native in-process engine) every weight is exactly 1 and nothing is computed. Metrics:
    rollout_corr/is_weight_mean, _max, is_clipped_fraction."""

    level: str = field(default="none", metadata={
        "doc": "none = off; text: token (per token) or sequence (the response's product of ratios); "
               "diffusion: step (per denoising step) or sequence (over the sample's trained steps)."})
    cap: float = field(default=2.0, metadata={"doc": "C, >= 1 (Yao et al.: 2)."})
    mode: str = field(default="truncate", metadata={
        "doc": "truncate clamps w at C; mask sets w to 0 where it exceeds C (the action leaves the loss)."})

    def check(self) -> None:
        if self.level not in ROLLOUT_IS_LEVELS:
            raise ValueError(f"level={self.level!r}: expected one of {', '.join(ROLLOUT_IS_LEVELS)} (token or "
                             f"sequence for text models, step or sequence for diffusion)")
        if self.mode not in ROLLOUT_IS_MODES:
            raise ValueError(f"mode={self.mode!r}: expected one of truncate (clamp the weight at "
                             f"algo.rollout_correction_options.cap), mask (drop the action above it)")
        if not (math.isfinite(self.cap) and self.cap >= 1):
            raise ValueError(f"cap={self.cap!r}: expected a finite value >= 1 (identical log-probs give weight 1; "
                             f"Yao et al. use 2)")


def rollout_is_weights(
    old_log_prob: Tensor, rollout_log_prob: Tensor, mask: Tensor, level: str, cap: float, mode: str = "truncate"
) -> tuple[Tensor, dict[str, Tensor]]:
    """Detached fp32 weights `[N, E]` (0 where `mask` is 0) and their metrics; see the module doc."""
    if level not in ROLLOUT_IS_LEVELS or level == "none":
        raise ValueError(
            f"level={level!r}: expected one of {', '.join(ROLLOUT_IS_LEVELS[1:])} (with 'none' there is "
            f"nothing to weigh: do not call this)"
        )
    if mode not in ROLLOUT_IS_MODES:
        raise ValueError(f"mode={mode!r}: expected one of {', '.join(ROLLOUT_IS_MODES)}")
    if not cap >= 1:
        raise ValueError(f"cap={cap!r}: expected >= 1 (identical log-probs give weight 1; Yao et al. use 2)")
    shape = tuple(old_log_prob.shape)
    if len(shape) != 2 or tuple(rollout_log_prob.shape) != shape or tuple(mask.shape) != shape:
        raise ValueError(
            f"old_log_prob {shape}, rollout_log_prob {tuple(rollout_log_prob.shape)} and mask "
            f"{tuple(mask.shape)} must share one shape [N, E] (a row per sample, a column per action)"
        )
    counted = mask.detach().to(old_log_prob.device) > 0
    zeros = torch.zeros(shape, dtype=torch.float64, device=old_log_prob.device)
    # fp64 and where(): a masked entry holding inf/NaN stays out, and long sums stay exact enough.
    log_ratio = torch.where(
        counted, old_log_prob.detach().double() - rollout_log_prob.detach().to(old_log_prob.device).double(), zeros
    )
    if level == "sequence":
        log_w, units = log_ratio.sum(dim=-1), counted.any(dim=-1)  # one weight per row [N]
    else:
        log_w, units = log_ratio, counted
    raw = torch.exp(log_w)
    over = raw > cap
    applied = torch.clamp(raw, max=cap) if mode == "truncate" else torch.where(over, torch.zeros_like(raw), raw)
    per_action = applied[:, None].expand(shape) if level == "sequence" else applied
    weights = torch.where(counted, per_action, zeros).to(torch.float32)
    count = units.sum().clamp(min=1)
    none = torch.zeros_like(raw)
    metrics = {
        "is_weight_mean": torch.where(units, applied, none).sum() / count,
        "is_weight_max": torch.where(units, raw, none).max(),
        "is_clipped_fraction": (over & units).sum() / count,
    }
    return weights, metrics

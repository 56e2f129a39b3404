"""Token-level policy losses for the autoregressive (text / omni) path: GRPO, DAPO, GSPO, CISPO, SAPO.

Each loss is a class in `TOKEN_LOSSES`, built once from its options and called on a
`TokenLossInput` (response tokens `[B, T]` with a mask). Advantages are clamped to
+-adv_clip_max, masked tokens change neither loss nor gradient, and a KL to the reference and
rollout-correction weights apply per token. docs/algorithms.md gives the aggregation modes, KL
estimators and dual clip (Token losses), the metrics, and the conventions that differ from verl.

    loss, metrics = PPOClipLoss(clip_range=0.2, loss_agg_mode="token-mean")(inp)

Not here: advantages, DAPO's dynamic sampling and overlong shaping, and normalisation across
micro-batches or ranks (every mean is over this one call's entries).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, NamedTuple, Optional

import torch
from torch import Tensor

from omni_rl.algos.policy_losses import (
    AdvantageClipOptions, PolicyLoss, check_clip, check_entries, clipped_surrogate, option, rollout_weighted,
)
from omni_rl.registry import Registry

__all__ = [
    "TOKEN_LOSSES",
    "get_token_loss",
    "LOSS_AGG_MODES",
    "SUM_NORM_MODE",
    "ALL_LOSS_AGG_MODES",
    "KL_ESTIMATORS",
    "aggregate",
    "token_kl",
    "sapo_gate",
    "TokenLossInput",
    "TokenLoss",
    "TokenLossOptions",
    "AggregatedTokenOptions",
    "PPOClipOptions",
    "DAPOOptions",
    "GSPOOptions",
    "SAPOOptions",
    "PPOClipLoss",
    "DAPOLoss",
    "GSPOLoss",
    "CISPOLoss",
    "SAPOLoss",
]

Metrics = dict[str, Tensor]

# Modes whose denominators are counts of this batch's tokens or sequences ...
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
# ... and Dr.GRPO's, which also divides by the constant `loss_scale_factor`.
SUM_NORM_MODE = "seq-mean-token-sum-norm"
ALL_LOSS_AGG_MODES = LOSS_AGG_MODES + (SUM_NORM_MODE,)



@dataclass
class TokenLossOptions(AdvantageClipOptions):
    """What every token loss reads: the ratio's clip range and the KL estimate to the reference."""

    clip_range: float = option(0.2, "Lower ratio clip: [1 - clip_range, ...] (PPO: 0.2).")
    clip_range_high: Optional[float] = option(None, "Upper ratio clip; null = clip_range (DAPO's clip-higher: 0.28).")
    kl_estimator: str = option("k3", "Per-token KL estimate to the reference: k1 (log-ratio) or k3 (Schulman's, >= 0).")
    kl_clamp: Optional[float] = option(None, "Clamp each token's KL estimate to [-kl_clamp, kl_clamp]; null (or inf) = none "
                                             "(verl: 10).", infinite=True)

    @property
    def clip_low(self) -> float:
        return self.clip_range

    @property
    def clip_high(self) -> float:
        return self.clip_range if self.clip_range_high is None else self.clip_range_high

    def check(self) -> None:
        super().check()
        check_clip(self.clip_range, self.clip_range_high)
        _check_estimator(self.kl_estimator)
        if self.kl_clamp is not None and not self.kl_clamp > 0:
            raise ValueError(f"kl_clamp={self.kl_clamp!r}: expected > 0 (verl clamps k3 at 10), or null for no clamp")


@dataclass
class AggregatedTokenOptions(TokenLossOptions):
    """A token loss whose aggregation is the recipe's choice (`aggregate`)."""

    loss_agg_mode: str = option("token-mean", f"How per-token terms become one number: {', '.join(ALL_LOSS_AGG_MODES)}.")
    loss_scale_factor: Optional[float] = option(
        None, "The constant C of seq-mean-token-sum-norm (Dr.GRPO); null = rollout.sampling_options.max_new_tokens. Only with that mode.")

    def check(self) -> None:
        super().check()
        _check_mode(self.loss_agg_mode)
        if self.loss_scale_factor is not None and not self.loss_scale_factor > 0:
            raise ValueError(f"loss_scale_factor={self.loss_scale_factor!r}: expected > 0 (Dr.GRPO's response length "
                             f"budget, e.g. 1024), or null for rollout.sampling_options.max_new_tokens")
        if self.loss_scale_factor is not None and self.loss_agg_mode != SUM_NORM_MODE:
            raise ValueError(f"loss_scale_factor={self.loss_scale_factor!r}: expected null with loss_agg_mode="
                             f"{self.loss_agg_mode} (only {SUM_NORM_MODE} reads it); remove it or set that mode")


def _check_dual_clip(clip_ratio_c: Optional[float]) -> None:
    if clip_ratio_c is not None and not clip_ratio_c > 1:
        raise ValueError(f"clip_ratio_c={clip_ratio_c!r}: expected > 1 (the dual clip caps a negative-advantage "
                         f"token's loss at -A * clip_ratio_c; verl uses 3.0), or null for no dual clip")


_DUAL_CLIP_DOC = "Dual-clip PPO: a token with A < 0 loses at most -A * clip_ratio_c (> 1); null = off (verl: 3.0)."


@dataclass
class PPOClipOptions(AggregatedTokenOptions):
    clip_ratio_c: Optional[float] = option(None, _DUAL_CLIP_DOC)

    def check(self) -> None:
        super().check()
        _check_dual_clip(self.clip_ratio_c)


@dataclass
class DAPOOptions(TokenLossOptions):
    """DAPO's: no loss_agg_mode (always token-mean)."""

    clip_ratio_c: Optional[float] = option(None, _DUAL_CLIP_DOC)

    def check(self) -> None:
        super().check()
        _check_dual_clip(self.clip_ratio_c)


@dataclass
class GSPOOptions(TokenLossOptions):
    """GSPO's: a sequence ratio, so ranges ~1e3 smaller than token PPO's, and no loss_agg_mode."""

    clip_range: float = option(3e-4, "Lower clip of the sequence ratio (GSPO: 3e-4).")
    clip_range_high: Optional[float] = option(4e-4, "Upper clip of the sequence ratio (GSPO: 4e-4); null = clip_range.")


@dataclass
class SAPOOptions(AggregatedTokenOptions):
    """SAPO's gate temperatures (clip_range is only the clipfrac diagnostic's range)."""

    tau_pos: float = option(1.0, "Gate temperature for tokens with A > 0 (SAPO: 1.0).")
    tau_neg: float = option(1.05, "Gate temperature for tokens with A <= 0 (SAPO: 1.05).")

    def check(self) -> None:
        super().check()
        for name, tau in (("tau_pos", self.tau_pos), ("tau_neg", self.tau_neg)):
            if not (math.isfinite(tau) and tau > 0):
                raise ValueError(f"{name}={tau!r}: expected a finite value > 0 (SAPO uses 1.0 and 1.05)")


@dataclass
class TokenLossInput:
    """The tensors of a token loss: E = `[B, T]` entries, one padded row per sequence.

    log_prob:      `[B, T]` the current policy's token log-probs (carries the graph).
    old_log_prob:  `[B, T]` the behaviour policy's.
    advantages:    `[B, 1]` (one per sequence) or `[B, T]`.
    mask:          optional `[B, T]`, 1 on the response tokens.
    ref_log_prob:  optional `[B, T]`, the reference policy's token log-probs (a constant); with it
                   the KL estimate is reported, and added times the loss's kl_coef.
    rollout_is_weight: optional, broadcastable to `[B, T]`, >= 0, a constant (the rollout correction).
    """

    log_prob: Tensor
    old_log_prob: Tensor
    advantages: Tensor
    mask: Optional[Tensor] = None
    ref_log_prob: Optional[Tensor] = None
    rollout_is_weight: Optional[Tensor] = None

    def __post_init__(self) -> None:
        check_entries(self.log_prob, self.old_log_prob, self.advantages, self.mask, self.rollout_is_weight)
        shape = tuple(self.log_prob.shape)
        if self.ref_log_prob is not None and tuple(self.ref_log_prob.shape) != shape:
            raise ValueError(
                f"ref_log_prob has shape {tuple(self.ref_log_prob.shape)}; expected log_prob's shape {shape} "
                f"(the reference policy's log-probs of the same tokens)."
            )


class TokenLoss(PolicyLoss):
    """A token loss (`TOKEN_LOSSES`), called with a `TokenLossInput`.

    `kl_coef` (>= 0, the run's `algo.kl_coef`, not an option of the loss) weighs the KL term:
    with `ref_log_prob` given the loss is policy_loss + kl_coef * kl."""

    Options: ClassVar[type] = TokenLossOptions

    def __init__(self, options=None, /, *, kl_coef: float = 0.0, **knobs):
        super().__init__(options, **knobs)
        if not (math.isfinite(kl_coef) and kl_coef >= 0):
            raise ValueError(f"kl_coef={kl_coef!r}: expected >= 0 (0 turns the KL term off)")
        self.kl_coef = kl_coef

    def __call__(self, inp: TokenLossInput) -> tuple[Tensor, Metrics]:
        raise NotImplementedError


TOKEN_LOSSES: Registry[type[TokenLoss]] = Registry("token loss")


def get_token_loss(name: str) -> type[TokenLoss]:
    """The registered token loss class called `name` (`ppo_clip`, `dapo`, `gspo`, `cispo`, `sapo`)."""
    return TOKEN_LOSSES.get(name)


def _k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    return log_prob - ref_log_prob


def _k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    # With x = ref - logp and q = pi_ref / pi = e^x: E_pi[e^x - x - 1] = KL(pi || ref) since
    # E_pi[e^x] = 1; each term is >= 0 because e^x >= 1 + x.
    x = ref_log_prob - log_prob
    return torch.exp(x) - x - 1


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": _k1, "k3": _k3}


# --------------------------------------------------------------------------------------------
# Aggregation and KL.
# --------------------------------------------------------------------------------------------


def _check_mode(mode: str) -> None:
    if mode not in ALL_LOSS_AGG_MODES:
        raise ValueError(
            f"loss_agg_mode={mode!r} is unknown; expected one of {', '.join(ALL_LOSS_AGG_MODES)}. "
            f"Pass one of those as loss_agg_mode."
        )


def aggregate(values: Tensor, mask: Optional[Tensor], mode: str, scale: Optional[float] = None) -> Tensor:
    """Reduce per-token `values` `[B, T]` to a 0-d tensor over the tokens where `mask` > 0.

    `mask` None counts every token. docs/algorithms.md tables the four modes. `scale` is the
    constant C of seq-mean-token-sum-norm (`loss_scale_factor`), required there and not read by
    the other modes.
    """
    _check_mode(mode)
    if mode == SUM_NORM_MODE and scale is None:
        raise ValueError(
            f"loss_agg_mode={mode!r} divides by a constant, loss_scale_factor, but it is None; pass "
            f"Dr.GRPO's response length budget (the loss option loss_scale_factor, null meaning "
            f"rollout.sampling_options.max_new_tokens)."
        )
    if values.ndim != 2:
        raise ValueError(
            f"aggregate expects per-token values [B, T]; got shape {tuple(values.shape)}. "
            f"Pass one padded row per sequence."
        )
    if mask is None:
        counted = torch.ones_like(values, dtype=torch.bool)
    elif tuple(mask.shape) != tuple(values.shape):
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}; expected the values' shape {tuple(values.shape)}"
        )
    else:
        counted = mask.to(values.device) > 0
    # where() rather than values * mask: an inf/NaN at a masked token must not leak in.
    kept = torch.where(counted, values, torch.zeros_like(values))
    if mode == "token-mean":
        return kept.sum() / counted.sum().clamp(min=1)
    tokens = counted.sum(dim=-1)  # [B]
    per_seq = kept.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / tokens.clamp(min=1)
    has_tokens = tokens > 0
    per_seq = torch.where(has_tokens, per_seq, torch.zeros_like(per_seq))
    seq_mean = per_seq.sum() / has_tokens.sum().clamp(min=1)
    return seq_mean / scale if mode == SUM_NORM_MODE else seq_mean


def token_kl(
    log_prob: Tensor, ref_log_prob: Tensor, estimator: str = "k3", clamp: Optional[float] = None
) -> Tensor:
    """Per-token KL(pi || ref) estimate, same shape as `log_prob`: "k1" or "k3" (docs/algorithms.md).

    With `clamp` = c > 0 the estimate is clamped to [-c, c], in value and gradient like
    torch.clamp(kl, -c, c) (0 gradient where it binds).
    """
    _check_estimator(estimator)
    estimate = KL_ESTIMATORS[estimator]
    ref = ref_log_prob.detach()
    kl = estimate(log_prob, ref)
    if clamp is None:
        return kl
    # Not torch.clamp(kl): where k3's exp(ref - logp) overflowed to inf, clamp's zero gradient times
    # exp's infinite derivative is NaN. So the tokens where the clamp binds are scored again at
    # logp = ref (finite, and detached, so their gradient is exactly 0) and then replaced by +-c.
    binds = kl.detach().abs() >= clamp
    kl_inside = estimate(torch.where(binds, ref, log_prob), ref)
    return torch.where(binds, clamp * torch.sign(kl.detach()), kl_inside)


def _check_estimator(estimator: str) -> None:
    if estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"kl_estimator={estimator!r} is unknown; expected one of {', '.join(KL_ESTIMATORS)}. "
            f"Pass one of those as kl_estimator."
        )


# --------------------------------------------------------------------------------------------
# Shared pieces.
# --------------------------------------------------------------------------------------------


class _Tokens(NamedTuple):
    """fp32 `[B, T]` tensors, all 0 at masked tokens; `counted` is the boolean mask."""

    log_prob: Tensor
    log_ratio: Tensor
    advantages: Tensor
    counted: Tensor


def _prepare(inp: TokenLossInput, adv_clip_max: float, loss: str) -> _Tokens:
    shape = tuple(inp.log_prob.shape)
    if inp.log_prob.ndim != 2:
        raise ValueError(
            f"policy loss {loss!r} scores tokens: log_prob has shape {shape}, expected [B, T] (one padded "
            f"row per sequence, mask marking the response tokens). For one entry per sample use flow_grpo."
        )
    if inp.advantages.ndim < 2:
        # TokenLossInput lets [B] through when B == T, where it would broadcast along the tokens.
        raise ValueError(
            f"policy loss {loss!r}: advantages have shape {tuple(inp.advantages.shape)}; expected [B, 1] "
            f"or [B, T] for log_prob {shape}. Pass advantages[:, None]."
        )
    device = inp.log_prob.device
    if inp.mask is None:
        counted = torch.ones(shape, dtype=torch.bool, device=device)
    else:
        counted = inp.mask.detach().to(device) > 0
    zeros = torch.zeros(shape, dtype=torch.float32, device=device)
    # Masking the inputs, not only the outputs, keeps exp() finite and the gradient exactly 0 at
    # masked tokens whatever they hold.
    log_prob = torch.where(counted, inp.log_prob.to(torch.float32), zeros)
    old = torch.where(counted, inp.old_log_prob.detach().to(device=device, dtype=torch.float32), zeros)
    adv = inp.advantages.detach().to(device=device, dtype=torch.float32)
    adv = torch.clamp(adv, -adv_clip_max, adv_clip_max).expand(shape)
    adv = torch.where(counted, adv, zeros)
    return _Tokens(log_prob, log_prob - old, adv, counted)


def _ratio_stats(ratio: Tensor, counted: Tensor, options: TokenLossOptions) -> Metrics:
    """ratio_mean/std/max_abs_dev and clipfrac over the entries where `counted` (any shape)."""
    ratio = ratio.detach()
    count = counted.sum().clamp(min=1)
    zeros = torch.zeros_like(ratio)

    def mean(x: Tensor) -> Tensor:
        return torch.where(counted, x, zeros).sum() / count

    ratio_mean = mean(ratio)
    outside = (ratio < 1 - options.clip_low) | (ratio > 1 + options.clip_high)
    return {
        "ratio_mean": ratio_mean,
        "ratio_std": mean((ratio - ratio_mean) ** 2).sqrt(),
        "ratio_max_abs_dev": torch.where(counted, (ratio - 1).abs(), zeros).max(),
        "clipfrac": mean(outside.to(torch.float32)),
    }


def _finish(
    loss_: TokenLoss, per_token: Tensor, mode: str, toks: _Tokens, inp: TokenLossInput, metrics: Metrics
) -> tuple[Tensor, Metrics]:
    """Weigh the policy term by the rollout correction (if any), aggregate it, add the KL term,
    fill policy_loss / approx_kl / kl."""
    o = loss_.options
    scale = o.loss_scale_factor if isinstance(o, AggregatedTokenOptions) else None  # the others are token-mean
    policy_loss = aggregate(rollout_weighted(per_token, inp.rollout_is_weight), toks.counted, mode, scale)
    loss = policy_loss
    if inp.ref_log_prob is not None:
        ref = inp.ref_log_prob.detach().to(device=toks.log_prob.device, dtype=torch.float32)
        ref = torch.where(toks.counted, ref, torch.zeros_like(ref))  # masked: logp = ref = 0 -> kl 0
        per_token_kl = token_kl(toks.log_prob, ref, o.kl_estimator, o.kl_clamp)
        kl = aggregate(per_token_kl, toks.counted, mode, scale)
        metrics["kl"] = kl.detach()
        if loss_.kl_coef > 0:
            loss = loss + loss_.kl_coef * kl
    elif loss_.kl_coef > 0:
        raise ValueError(
            f"kl_coef={loss_.kl_coef!r} > 0 but ref_log_prob is None; pass the reference policy's token "
            f"log-probs, or set kl_coef to 0."
        )
    metrics["approx_kl"] = 0.5 * aggregate(toks.log_ratio.detach() ** 2, toks.counted, "token-mean")
    metrics["policy_loss"] = policy_loss.detach()
    return loss, metrics


# --------------------------------------------------------------------------------------------
# The losses.
# --------------------------------------------------------------------------------------------


def _ppo_clip(loss_: TokenLoss, inp: TokenLossInput, mode: str, name: str) -> tuple[Tensor, Metrics]:
    o = loss_.options
    toks = _prepare(inp, o.adv_clip_max, name)
    ratio = torch.exp(toks.log_ratio)
    per_token = clipped_surrogate(ratio, toks.advantages, o.clip_low, o.clip_high)
    metrics = _ratio_stats(ratio, toks.counted, o)
    if o.clip_ratio_c is not None:
        # Dual clip: for A < 0, min(clipped loss, -A c). where() rather than minimum() so that the
        # tokens where the cap binds get exactly no gradient.
        cap = -toks.advantages * o.clip_ratio_c
        binds = (toks.advantages < 0) & (per_token > cap) & toks.counted
        per_token = torch.where(binds, cap, per_token)
        metrics["clipfrac_lower"] = binds.sum() / toks.counted.sum().clamp(min=1)
    return _finish(loss_, per_token, mode, toks, inp, metrics)


@TOKEN_LOSSES.register("ppo_clip")
class PPOClipLoss(TokenLoss):
    """GRPO's per-token clipped surrogate (PPO's, with group-relative advantages).

        r_t  = exp(log_prob_t - old_log_prob_t)
        l_t  = max(-A r_t, -A clip(r_t, 1 - clip_low, 1 + clip_high))
        l_t  = min(l_t, -A clip_ratio_c)    where A < 0, when clip_ratio_c is given (dual clip)
        loss = agg_t(l_t)  [+ kl_coef * agg(kl)]

    agg is `loss_agg_mode`. On-policy r_t = 1 exactly and the gradient is the REINFORCE one,
    agg_t(-A d log_prob_t). verl's `vanilla` loss differs in a few conventions (docs/algorithms.md).
    """

    Options = PPOClipOptions

    def __call__(self, inp: TokenLossInput) -> tuple[Tensor, Metrics]:
        return _ppo_clip(self, inp, self.options.loss_agg_mode, "ppo_clip")


@TOKEN_LOSSES.register("dapo")
class DAPOLoss(TokenLoss):
    """DAPO (arXiv 2503.14476): `ppo_clip` with token-mean aggregation, always.

    DAPO's loss is the clipped surrogate averaged over all tokens of the batch (long responses
    weigh per token, not per sequence), so it has no `loss_agg_mode` option. Its other choices are
    the recipe's: clip-higher (clip_range 0.2, clip_range_high 0.28), no KL (kl_coef 0), dynamic
    sampling. The dual clip (`clip_ratio_c`) applies as in `ppo_clip`. verl's DAPO scripts run its
    vanilla loss with clip_ratio_c=10 and loss_agg_mode=token-mean: set clip_ratio_c: 10.0 to match.
    """

    Options = DAPOOptions

    def __call__(self, inp: TokenLossInput) -> tuple[Tensor, Metrics]:
        return _ppo_clip(self, inp, "token-mean", "dapo")


@TOKEN_LOSSES.register("gspo")
class GSPOLoss(TokenLoss):
    """GSPO (arXiv 2507.18071): one clipped importance ratio per sequence, in its token form.

    1. Sequence ratio over the |y_i| valid tokens (length-normalised):
           log s_i = (1 / |y_i|) sum_t (log_prob_{i,t} - old_log_prob_{i,t})
    2. Token form (GSPO-token): log s_{i,t} = sg[log s_i] + log_prob_{i,t} - sg[log_prob_{i,t}].
       Its value is s_i and d s_{i,t} / d log_prob_{i,t} = s_i, so with a per-sequence A it gives
       the sequence form's value and gradient, and it also accepts per-token advantages [B, T].
    3. loss = seq-mean-token-mean( max(-A s_{i,t}, -A clip(s_{i,t}, 1 - clip_low, 1 + clip_high)) ),
       which equals mean_i max(-A_i s_i, -A_i clip(s_i)). There is no `loss_agg_mode` option: a
       token mean would weigh sequences by their length, which the sequence ratio is there to avoid.

    Clip ranges are ~1e3 smaller than token PPO's (GSPO: 3e-4 / 4e-4, the defaults) because
    log s_i is a mean. ratio_* and clipfrac describe s_i over the sequences that hold a valid
    token; approx_kl is over tokens. A sequence without a valid token has s_i = 1 and takes no part.
    There is no dual clip. verl's `gspo` differs in its clamp and clipfrac (docs/algorithms.md).
    """

    Options = GSPOOptions

    def __call__(self, inp: TokenLossInput) -> tuple[Tensor, Metrics]:
        o = self.options
        toks = _prepare(inp, o.adv_clip_max, "gspo")
        tokens = toks.counted.sum(dim=-1)  # [B]
        seq_log_ratio = toks.log_ratio.sum(dim=-1) / tokens.clamp(min=1)
        token_log_ratio = seq_log_ratio.detach()[:, None] + toks.log_prob - toks.log_prob.detach()
        per_token = clipped_surrogate(torch.exp(token_log_ratio), toks.advantages, o.clip_low, o.clip_high)
        metrics = _ratio_stats(torch.exp(seq_log_ratio), tokens > 0, o)
        return _finish(self, per_token, "seq-mean-token-mean", toks, inp, metrics)


@TOKEN_LOSSES.register("cispo")
class CISPOLoss(TokenLoss):
    """CISPO (MiniMax-M1, arXiv 2506.13585): a clipped, stopped importance weight on REINFORCE.

        loss = agg_t( -sg[clip(r_t, 1 - clip_low, 1 + clip_high)] * A * log_prob_t )

    The weight carries no gradient, so d loss / d log_prob_t = -clip(r_t) A (times agg's weight):
    unlike PPO, a token whose ratio left the range still gets a (bounded) gradient. The loss
    value is a weighted log-likelihood, not a surrogate near -A, so its level is not comparable
    with the other losses'. MiniMax bound only the top: set clip_range near 1 to do the same.
    There is no dual clip (the weight is already bounded).
    """

    Options = AggregatedTokenOptions

    def __call__(self, inp: TokenLossInput) -> tuple[Tensor, Metrics]:
        o = self.options
        toks = _prepare(inp, o.adv_clip_max, "cispo")
        ratio = torch.exp(toks.log_ratio)
        weight = torch.clamp(ratio, 1 - o.clip_low, 1 + o.clip_high).detach()
        per_token = -weight * toks.advantages * toks.log_prob
        return _finish(self, per_token, o.loss_agg_mode, toks, inp, _ratio_stats(ratio, toks.counted, o))


def sapo_gate(ratio: Tensor, tau: Tensor | float) -> Tensor:
    """SAPO's soft gate f(r) = (4 / tau) sigmoid(tau (r - 1)).

    f(1) = 2 / tau and f'(r) = 4 sigmoid(x) (1 - sigmoid(x)) with x = tau (r - 1), so f'(1) = 1:
    on-policy the gate has the gradient of r itself, and it decays smoothly (rather than being
    cut to 0 as by a hard clip) as r moves away from 1, faster for larger tau.
    """
    return (4 / tau) * torch.sigmoid(tau * (ratio - 1))


@TOKEN_LOSSES.register("sapo")
class SAPOLoss(TokenLoss):
    """SAPO (Soft Adaptive Policy Optimization, Qwen): a temperature-controlled soft gate for the clip.

        tau_t = tau_pos where A > 0 else tau_neg
        loss  = agg_t( -f(r_t; tau_t) * A ),   f(r; tau) = (4 / tau) sigmoid(tau (r - 1))

    tau_neg > tau_pos damps negative-advantage tokens faster: pushing down a token's probability
    spreads mass over the whole vocabulary and is the less stable direction. On-policy the loss
    value is -2 A / tau, but the gradient is REINFORCE's, agg_t(-A d log_prob_t). The clip range
    is not used by the loss; clipfrac reports the tokens outside it as a diagnostic. There is no
    dual clip (the gate is bounded by 4 / tau).
    """

    Options = SAPOOptions

    def __call__(self, inp: TokenLossInput) -> tuple[Tensor, Metrics]:
        o = self.options
        toks = _prepare(inp, o.adv_clip_max, "sapo")
        ratio = torch.exp(toks.log_ratio)
        tau = torch.where(toks.advantages > 0, o.tau_pos, o.tau_neg)
        per_token = -sapo_gate(ratio, tau) * toks.advantages
        return _finish(self, per_token, o.loss_agg_mode, toks, inp, _ratio_stats(ratio, toks.counted, o))

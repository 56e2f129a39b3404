"""On-policy distillation maths: how far the student's own actions are from a frozen teacher's.

The student samples; a teacher scores the very states the student visited. Two kinds of action:

- **Diffusion steps.** At a stored step the student's transition is N(mu_theta, s^2 I) and the
  teacher's, under the same kernel, sigma, noise level and state x_t, is N(mu_T, s^2 I) (the same
  s: the kernel's std depends on sigma and the noise level only). Their KL per dimension is
  (mu_theta - mu_T)^2 / (2 s^2); `diffusion_distill_kl` averages it over the latent dimensions, as
  the step log-probs are averaged (`flow_sde`). On a deterministic step (s = 0: the ode kernel, a
  noise level of 0) the KL is undefined, and 1/2 mean_d (mu_theta - mu_T)^2 takes its place: the
  same squared distance without the 1/s^2 weight.
- **Tokens.** With log pi_S(y_t) and log pi_T(y_t) of the sampled tokens, the per-token reverse
  KL estimate is k1 = log pi_S(y_t) - log pi_T(y_t) (`token_reverse_kl`; its mean under the
  student is KL(pi_S || pi_T)). It trains the student two ways: as a per-token advantage
  -k1 of the policy-gradient loss (`distill_advantages`, the reward-style form), or as a direct
  loss (`direct_distill_loss`). The exact per-position KL over the whole vocabulary, where both
  models share a tokenizer, is `full_vocab_reverse_kl`, computed a chunk of positions at a time.

The teacher's side is a constant everywhere here (detached): the gradient reaches the student only.
Not here: which teacher scores which sample, the teacher's forward, the coefficient of the term
beside the RL loss (the model families and `omni_rl.families.teachers`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from omni_rl.algos.flow_sde import mean_over_sample_dims, per_sample
from omni_rl.algos.policy_losses import StepLoss, StepLossInput
from omni_rl.option import ComponentOptions
from omni_rl.registry import Registry

__all__ = [
    "DISTILL_LOSSES",
    "DistillKLOptions",
    "DistillKLLoss",
    "diffusion_distill_kl",
    "token_reverse_kl",
    "distill_advantages",
    "direct_distill_loss",
    "full_vocab_reverse_kl",
]


def diffusion_distill_kl(mean: Tensor, teacher_mean: Tensor, std: Tensor | float, std_checked: bool = False) -> Tensor:
    """KL(N(mean, s^2 I) || N(teacher_mean, s^2 I)) per dimension, averaged over the latent dims: `[B]`.

    mean_d (mean - teacher_mean)^2 / (2 s^2) where s > 0, and 1/2 mean_d (mean - teacher_mean)^2
    where s = 0 (a deterministic step). `mean`, `teacher_mean`: `[B, ...]` of one shape (several
    latent streams flattened into one `[B, D]` action first); `std`: `[B]` or a float (>= 0), the
    transition std of the step (`std_checked`: a step kernel's, on checked sigmas, so the host
    check is skipped). The gradient flows through `mean` only.
    """
    if mean.ndim < 2 or mean.shape != teacher_mean.shape:
        raise ValueError(f"distill KL: mean {tuple(mean.shape)} and teacher_mean {tuple(teacher_mean.shape)} must be "
                         f"latents of one shape [B, ...]; pass the student's and the teacher's StepOutput.mean")
    s = per_sample(std, batch=mean.shape[0], device=mean.device, name="std").to(torch.float32)
    if not std_checked and (bool((s < 0).any()) or not bool(torch.isfinite(s).all())):
        raise ValueError(f"distill KL: std {s.tolist()}: expected finite values >= 0 (StepOutput.std)")
    sq = mean_over_sample_dims((mean.to(torch.float32) - teacher_mean.detach().to(torch.float32)) ** 2)
    # s = 0 divides by 1: the deterministic step's 1/2 ||.||^2.
    var = torch.where(s > 0, s**2, torch.ones_like(s))
    return sq / (2 * var)


# Losses that are distillation alone (no policy-gradient term). A registry of their own beside
# `DIFFUSION_LOSSES`, which lists the RL step losses: the diffusion family takes its
# `algo.policy_loss` from the union of both (and the forward-process losses).
DISTILL_LOSSES: Registry[type[StepLoss]] = Registry("distillation loss")


@dataclass
class DistillKLOptions(ComponentOptions):
    """distill_kl has no knobs: the KL is the loss (its weight is the learning rate's business)."""

    def check(self) -> None:
        pass


@DISTILL_LOSSES.register("distill_kl")
class DistillKLLoss(StepLoss):
    """Pure on-policy distillation: loss = mean over entries of `diffusion_distill_kl`, the
    student's step against the teacher's at the student's own state. No reward, advantage or
    ratio enters (the family still computes them, for the metrics); `policy_loss` is the KL."""

    Options = DistillKLOptions
    reads_teacher_mean = True

    def __call__(self, inp: StepLossInput) -> tuple[Tensor, dict[str, Tensor]]:
        if inp.mean is None or inp.teacher_mean is None or inp.std is None:
            raise ValueError("distill_kl needs mean, teacher_mean and std (the student's and the teacher's "
                             "StepOutput.mean, the step's std); the diffusion family passes them with algo.teachers")
        kl = diffusion_distill_kl(inp.mean, inp.teacher_mean, inp.std, std_checked=inp.std_checked)
        if inp.mask is None:
            loss = kl.mean()
        else:
            m = inp.mask.to(kl.dtype)
            loss = (kl * m).sum() / m.sum().clamp(min=1.0)
        return loss, {"policy_loss": loss.detach(), "distill_kl": loss.detach()}


def _check_tokens(log_prob: Tensor, teacher_log_prob: Tensor, mask: Optional[Tensor]) -> None:
    if log_prob.shape != teacher_log_prob.shape:
        raise ValueError(f"token distillation: student log-probs {tuple(log_prob.shape)} and teacher log-probs "
                         f"{tuple(teacher_log_prob.shape)} must have one shape [B, T] (the same sampled tokens)")
    if mask is not None and mask.shape != log_prob.shape:
        raise ValueError(f"token distillation: mask {tuple(mask.shape)}: expected the log-probs' shape "
                         f"{tuple(log_prob.shape)}")


def token_reverse_kl(log_prob: Tensor, teacher_log_prob: Tensor) -> Tensor:
    """The per-token reverse KL estimate k1 = log pi_S(y_t) - log pi_T(y_t): `[B, T]`, detached
    (an estimate to report or to reward with, not a loss: see `direct_distill_loss`)."""
    _check_tokens(log_prob, teacher_log_prob, None)
    return (log_prob.detach().to(torch.float32) - teacher_log_prob.detach().to(torch.float32))


def distill_advantages(log_prob: Tensor, teacher_log_prob: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """The reward-style form: each token's advantage is -k1 = log pi_T(y_t) - log pi_S(y_t) (0 on
    masked positions), for the policy-gradient loss to push up tokens the teacher likes more than
    the student does. `[B, T]`, detached."""
    _check_tokens(log_prob, teacher_log_prob, mask)
    adv = -token_reverse_kl(log_prob, teacher_log_prob)
    return adv if mask is None else adv * mask.to(adv.dtype)


def direct_distill_loss(log_prob: Tensor, teacher_log_prob: Tensor, mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """The direct form: (loss, kl), both 0-d, token means over the mask.

    The loss is mean_t sg(k1_t) * log pi_S(y_t). Minimising k1 itself would not do: for fixed
    sampled tokens grad k1 = grad log pi_S(y_t), whose expectation under the student is 0. The
    gradient of the reverse KL sum_y pi_S(y) (log pi_S(y) - log pi_T(y)) is
    E_{y ~ pi_S}[(log pi_S(y) - log pi_T(y)) grad log pi_S(y)] (the score-function identity, the
    +1 term's expectation vanishing), which this loss's gradient estimates. `kl` is mean_t k1,
    the estimate to report.
    """
    _check_tokens(log_prob, teacher_log_prob, mask)
    k1 = token_reverse_kl(log_prob, teacher_log_prob)
    per_token = k1 * log_prob.to(torch.float32)
    if mask is None:
        return per_token.mean(), k1.mean()
    m = mask.to(torch.float32)
    count = m.sum().clamp(min=1.0)
    return (per_token * m).sum() / count, (k1 * m).sum() / count


def full_vocab_reverse_kl(logits: Tensor, teacher_logits: Tensor, chunk_size: int = 1024) -> Tensor:
    """The exact per-position KL(pi_S || pi_T) = sum_v p_S(v) (log p_S(v) - log p_T(v)): `[..., T]`
    from logits `[..., T, V]` of one shape (the same tokenizer), computed `chunk_size` positions at
    a time so that only one chunk's fp32 log-softmaxes are in memory at once. The gradient flows
    through `logits` only."""
    if logits.shape != teacher_logits.shape:
        raise ValueError(f"full-vocabulary KL: student logits {tuple(logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ; the exact KL needs one tokenizer (the same vocabulary)")
    if not (isinstance(chunk_size, int) and chunk_size >= 1):
        raise ValueError(f"full-vocabulary KL: chunk_size={chunk_size!r}: expected an integer >= 1 (positions per chunk)")
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat, teacher_flat = logits.reshape(-1, vocab), teacher_logits.detach().reshape(-1, vocab)
    parts = []
    for start in range(0, flat.shape[0], chunk_size):
        log_p = F.log_softmax(flat[start : start + chunk_size].to(torch.float32), dim=-1)
        log_q = F.log_softmax(teacher_flat[start : start + chunk_size].to(torch.float32), dim=-1)
        parts.append((log_p.exp() * (log_p - log_q)).sum(-1))
    return torch.cat(parts).reshape(lead) if parts else flat.new_zeros(lead, dtype=torch.float32)

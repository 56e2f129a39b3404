"""Rollout correction (`omni_rl/algos/rollout_correction.py`): the weights at each level against
hand-computed values, and how every policy loss applies them (`StepLossInput.rollout_is_weight`, `TokenLossInput.rollout_is_weight`)."""
import dataclasses
import math

import pytest
import torch

from omni_rl.algos import DIFFUSION_LOSSES, TOKEN_LOSSES, StepLossInput, TokenLossInput
from omni_rl.algos.policy_losses import StepLoss
from omni_rl.algos.rollout_correction import ROLLOUT_IS_LEVELS, rollout_is_weights

LN = math.log
# Two samples, three actions; the last action of row 1 is masked (and holds inf: it must not leak).
OLD = torch.tensor([[LN(1.5), LN(0.5), LN(4.0)], [LN(1.5), LN(4.0), 0.0]])
ROLLOUT = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, float("inf")]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


@pytest.mark.parametrize("level", ["token", "step"])
def test_per_action_weights_are_the_ratios_truncated_at_the_cap(level):
    weights, metrics = rollout_is_weights(OLD, ROLLOUT, MASK, level, cap=2.0)
    # ratios 1.5, 0.5, 4 -> 2 (truncated); 1.5, 4 -> 2; the masked action gets 0
    torch.testing.assert_close(weights, torch.tensor([[1.5, 0.5, 2.0], [1.5, 2.0, 0.0]]))
    assert not weights.requires_grad and weights.dtype == torch.float32
    assert float(metrics["is_weight_mean"]) == pytest.approx((1.5 + 0.5 + 2 + 1.5 + 2) / 5)
    assert float(metrics["is_weight_max"]) == pytest.approx(4.0)  # before truncation
    assert float(metrics["is_clipped_fraction"]) == pytest.approx(2 / 5)


def test_mask_mode_drops_the_actions_above_the_cap_and_keeps_the_others():
    weights, metrics = rollout_is_weights(OLD, ROLLOUT, MASK, "token", cap=2.0, mode="mask")
    torch.testing.assert_close(weights, torch.tensor([[1.5, 0.5, 0.0], [1.5, 0.0, 0.0]]))
    assert float(metrics["is_weight_mean"]) == pytest.approx((1.5 + 0.5 + 1.5) / 5)
    assert float(metrics["is_clipped_fraction"]) == pytest.approx(2 / 5)


@pytest.mark.parametrize("mode, capped", [("truncate", 2.0), ("mask", 0.0)])
def test_sequence_weight_is_the_product_of_the_row_ratios(mode, capped):
    weights, metrics = rollout_is_weights(OLD, ROLLOUT, MASK, "sequence", cap=2.0, mode=mode)
    # row 0: 1.5 * 0.5 * 4 = 3 -> capped; row 1: 1.5 * 4 = 6 -> capped (its masked action is left out)
    torch.testing.assert_close(weights, torch.tensor([[capped] * 3, [capped, capped, 0.0]]))
    old = torch.tensor([[LN(1.5), LN(0.5)], [LN(0.5), LN(0.5)]])
    weights, metrics = rollout_is_weights(old, torch.zeros(2, 2), torch.ones(2, 2), "sequence", cap=2.0, mode=mode)
    torch.testing.assert_close(weights, torch.tensor([[0.75, 0.75], [0.25, 0.25]]))
    assert float(metrics["is_weight_mean"]) == pytest.approx(0.5)  # over the two sequences
    assert float(metrics["is_weight_max"]) == pytest.approx(0.75)
    assert float(metrics["is_clipped_fraction"]) == 0.0


def test_identical_log_probs_give_weights_of_exactly_one():
    lp = torch.randn(3, 5)
    for level in ROLLOUT_IS_LEVELS[1:]:
        weights, metrics = rollout_is_weights(lp, lp.clone(), torch.ones(3, 5), level, cap=2.0)
        assert torch.equal(weights, torch.ones(3, 5))
        assert float(metrics["is_weight_max"]) == 1.0 and float(metrics["is_clipped_fraction"]) == 0.0


def test_bad_arguments_name_the_value_and_what_is_expected():
    ones = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"level='none': expected one of token, sequence, step"):
        rollout_is_weights(ones, ones, ones, "none", 2.0)
    with pytest.raises(ValueError, match=r"mode='clip': expected one of truncate, mask"):
        rollout_is_weights(ones, ones, ones, "token", 2.0, "clip")
    with pytest.raises(ValueError, match=r"cap=0.5: expected >= 1"):
        rollout_is_weights(ones, ones, ones, "token", 0.5)
    with pytest.raises(ValueError, match=r"must share one shape \[N, E\]"):
        rollout_is_weights(ones, torch.ones(2, 2), ones, "token", 2.0)
    with pytest.raises(ValueError, match=r"rollout_is_weight has shape \(3,\), which does not broadcast"):
        StepLossInput(torch.zeros(2), torch.zeros(2), torch.zeros(2), rollout_is_weight=torch.ones(3))


# --- the losses apply them ------------------------------------------------------------------------
# Every loss of the two registries whose input carries `rollout_is_weight` is checked below: the
# parametrisation iterates the registries, so a new loss is covered with no edit here (a loss
# from a plugin module: `check_rollout_correction(LossClass)`, as tests/docs/ does for the loss
# guide's example). The forward-process losses read no rollout log-probs and take no weight.
DIFFUSION = ("flow_grpo", "flow_dppo", "grpo_guard")
TOKEN = ("ppo_clip", "dapo", "gspo", "cispo", "sapo")
REGISTERED = [*DIFFUSION_LOSSES.names(), *TOKEN_LOSSES.names()]
# Options that take every branch of the shipped clipped token losses, where a loss declares them.
TOKEN_OPTIONS = {"clip_range": 0.2, "clip_range_high": 0.28}


def loss_input(name, weight=None, kl: bool = False) -> tuple[StepLossInput | TokenLossInput, torch.Tensor]:
    """A loss input slightly off-policy (every branch of the clipped losses is taken), with the
    current log-probs as the leaf whose gradient is compared. `name`: a registered loss's name,
    or a loss class."""
    g = torch.Generator().manual_seed(0)
    if is_diffusion(name):
        log_prob = (torch.randn(6, generator=g) * 1e-3).requires_grad_()
        mean = torch.randn(6, 4, generator=g).requires_grad_()
        inp = StepLossInput(
            log_prob, torch.zeros(6), torch.randn(6, generator=g), mean=mean, old_mean=mean.detach() + 1e-3,
            std=torch.full((6,), 0.1), dt=torch.full((6,), -0.1), rollout_is_weight=weight,
        )
        return inp, log_prob
    log_prob = (torch.randn(3, 4, generator=g) * 0.2).requires_grad_()
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    ref = torch.randn(3, 4, generator=g) * 0.1 if kl else None
    inp = TokenLossInput(
        log_prob, torch.zeros(3, 4), torch.randn(3, 1, generator=g), mask=mask, ref_log_prob=ref, rollout_is_weight=weight,
    )
    return inp, log_prob


def is_diffusion(name) -> bool:
    """A step loss (its input a StepLossInput) rather than a token loss."""
    return name in DIFFUSION_LOSSES if isinstance(name, str) else issubclass(name, StepLoss)


def get_loss(name, kl: bool = False):
    cls = name if not isinstance(name, str) else (DIFFUSION_LOSSES if is_diffusion(name) else TOKEN_LOSSES).get(name)
    if is_diffusion(name):
        return cls()
    fields = {f.name for f in dataclasses.fields(cls.Options)}
    options = {**TOKEN_OPTIONS, "kl_coef": 0.1 if kl else 0.0}
    return cls(**{key: value for key, value in options.items() if key in fields})


def check_rollout_correction(name) -> None:
    """The two contract checks below for one loss (a registered name or a loss class)."""
    test_weights_of_one_leave_loss_and_gradient_unchanged_bit_for_bit(name)
    test_the_policy_term_is_linear_in_the_weights(name)


def test_every_registered_loss_is_covered():
    assert set(DIFFUSION_LOSSES.names()) == set(DIFFUSION) and set(TOKEN_LOSSES.names()) == set(TOKEN)


@pytest.mark.parametrize("name", REGISTERED)
def test_weights_of_one_leave_loss_and_gradient_unchanged_bit_for_bit(name):
    fn = get_loss(name)
    plain, plain_lp = loss_input(name)
    loss, metrics = fn(plain)
    loss.backward()
    shape = plain_lp.shape
    one, one_lp = loss_input(name, weight=torch.ones(shape))
    loss_one, metrics_one = fn(one)
    loss_one.backward()
    assert torch.equal(loss, loss_one) and torch.equal(plain_lp.grad, one_lp.grad)
    assert all(torch.equal(metrics[k], metrics_one[k]) for k in metrics)


@pytest.mark.parametrize("name", REGISTERED)
def test_the_policy_term_is_linear_in_the_weights(name):
    """Each entry's policy term is multiplied by its weight: the gradient with weights a + b is
    the sum of those with a and with b, and a constant c scales loss and gradient by c."""
    fn = get_loss(name)
    shape = loss_input(name)[1].shape
    a, b = torch.rand(shape, generator=torch.Generator().manual_seed(1)), torch.rand(shape)

    def grad(weight):
        inp, lp = loss_input(name, weight=weight)
        loss, _ = fn(inp)
        loss.backward()
        return loss.detach(), lp.grad

    (la, ga), (lb, gb), (lab, gab) = grad(a), grad(b), grad(a + b)
    torch.testing.assert_close(lab, la + lb)
    torch.testing.assert_close(gab, ga + gb)
    l3, g3 = grad(torch.full(shape, 3.0))
    l1, g1 = grad(None)
    torch.testing.assert_close(l3, 3 * l1)
    torch.testing.assert_close(g3, 3 * g1)


def test_a_perturbed_rollout_changes_the_flow_grpo_gradient_as_predicted():
    # On-policy (log_prob == old) d loss / d log_prob_i = -A_i w_i / E, w_i = min(exp(old_i - rollout_i), C).
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    rollout = old - torch.tensor([0.0, LN(1.25), -LN(2.0), 2.0])  # ratios 1, 1.25, 0.5, e^2 -> 2
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0])
    weights, _ = rollout_is_weights(old[None], rollout[None], torch.ones(1, 4), "step", cap=2.0)
    log_prob = old.clone().requires_grad_()
    loss, _ = DIFFUSION_LOSSES.get("flow_grpo")()(StepLossInput(log_prob, old, adv, rollout_is_weight=weights[0]))
    loss.backward()
    torch.testing.assert_close(log_prob.grad, -adv * torch.tensor([1.0, 1.25, 0.5, 2.0]) / 4)


def test_a_perturbed_rollout_changes_the_token_gradient_as_predicted_and_not_the_kl():
    # ppo_clip, token-mean, on-policy: d loss / d log_prob_t = -A w_t / (valid tokens), plus the KL's.
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rollout = old - torch.tensor([[LN(1.5), 0.0, -LN(4.0)], [LN(3.0), 0.0, 0.0]])  # 1.5, 1, 0.25; 3 -> 2
    adv = torch.tensor([[1.0], [-1.0]])
    weights, _ = rollout_is_weights(old, rollout, mask, "token", cap=2.0)
    ref = torch.full((2, 3), -0.1)

    def run(weight):
        log_prob = old.clone().requires_grad_()
        loss, metrics = TOKEN_LOSSES.get("ppo_clip")(kl_coef=0.5)(
            TokenLossInput(log_prob, old, adv, mask=mask, ref_log_prob=ref, rollout_is_weight=weight)
        )
        loss.backward()
        return log_prob.grad, metrics

    weighted, metrics = run(weights)
    plain, plain_metrics = run(None)
    w = torch.tensor([[1.5, 1.0, 0.25], [2.0, 1.0, 0.0]])
    # The KL part of the gradient is the same in both; the policy part is scaled per token.
    policy_plain = -adv.expand(2, 3) * mask / 5
    torch.testing.assert_close(weighted - plain, policy_plain * (w - 1))
    assert torch.equal(metrics["kl"], plain_metrics["kl"])
    torch.testing.assert_close(metrics["policy_loss"], -(adv * w * mask).sum() / 5)

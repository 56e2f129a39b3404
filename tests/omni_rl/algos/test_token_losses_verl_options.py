"""Tests for the verl options of omni_rl.algos.token_losses: dual-clip PPO (clip_ratio_c), Dr.GRPO's
seq-mean-token-sum-norm aggregation (loss_scale_factor) and the clamped KL (kl_clamp), each with
values worked out by hand, then against verl's conventions written out plainly on random tensors,
in value and gradient."""
import math

import pytest
import torch

import omni_rl.algos  # noqa: F401  (registers the token losses)

from omni_rl.algos.token_losses import TokenLossInput, get_token_loss
from omni_rl.algos.token_losses import ALL_LOSS_AGG_MODES, SUM_NORM_MODE, aggregate, token_kl


def _log(ratios):
    return torch.tensor([[math.log(r) for r in row] for row in ratios])


# ------------------------------------------------------------------ dual clip

# Sequence 0 has A = -1, sequence 1 A = +2; clip range [0.8, 1.2], clip_ratio_c = 3.
DUAL_RATIOS = [[4.0, 2.0, 0.5], [4.0, 1.0, 0.5]]
DUAL_ADV = torch.tensor([[-1.0], [2.0]])
# Per token, l = max(-A r, -A clip(r)), then min(l, -A c) where A < 0:
#   (0,0) r 4,   A -1: max(4, 1.2) = 4 > -A c = 3   -> the dual clip binds: 3, no gradient
#   (0,1) r 2,   A -1: max(2, 1.2) = 2 <= 3         -> 2, gradient -A r = 2
#   (0,2) r 0.5, A -1: max(0.5, 0.8) = 0.8          -> clipped: 0.8, no gradient
#   (1,0) r 4,   A 2:  max(-8, -2.4) = -2.4         -> clipped (A > 0: no dual clip), no gradient
#   (1,1) r 1,   A 2:  -2                            -> gradient -A r = -2
#   (1,2) r 0.5, A 2:  max(-1, -1.6) = -1           -> gradient -A r = -1
DUAL_TOKENS = [[3.0, 2.0, 0.8], [-2.4, -2.0, -1.0]]
PLAIN_TOKENS = [[4.0, 2.0, 0.8], [-2.4, -2.0, -1.0]]  # the same without the dual clip


def _dual(name="ppo_clip", clip_ratio_c=3.0, **kwargs):
    log_prob = _log(DUAL_RATIOS).requires_grad_(True)
    inp = TokenLossInput(log_prob, torch.zeros(2, 3), DUAL_ADV)
    loss, metrics = get_token_loss(name)(clip_range=0.2, clip_range_high=0.2, clip_ratio_c=clip_ratio_c, **kwargs)(inp)
    loss.backward()
    return loss, metrics, log_prob.grad


@pytest.mark.parametrize("name", ["ppo_clip", "dapo"])
def test_dual_clip_hand_values_token_mean(name):
    loss, metrics, grad = _dual(name)
    # (3 + 2 + 0.8 - 2.4 - 2 - 1) / 6 = 0.4 / 6; without the dual clip (4 + ...) / 6 = 1.4 / 6
    assert loss.item() == pytest.approx(0.4 / 6, rel=1e-5)
    assert metrics["clipfrac_lower"].item() == pytest.approx(1 / 6)  # only token (0,0)
    # Gradients -A r / 6 where the unclipped, uncapped branch is taken, 0 elsewhere.
    torch.testing.assert_close(grad, torch.tensor([[0.0, 2.0, 0.0], [0.0, -2.0, -1.0]]) / 6)
    plain, plain_metrics, plain_grad = _dual(name, clip_ratio_c=None)
    assert plain.item() == pytest.approx(1.4 / 6, rel=1e-5)
    assert "clipfrac_lower" not in plain_metrics  # the metric exists only with the option
    torch.testing.assert_close(plain_grad, torch.tensor([[4.0, 2.0, 0.0], [0.0, -2.0, -1.0]]) / 6)


def test_dual_clip_honours_the_aggregation_of_ppo_clip():
    # seq-mean-token-sum: ((3 + 2 + 0.8) + (-2.4 - 2 - 1)) / 2 = (5.8 - 5.4) / 2 = 0.2
    loss, _, grad = _dual(loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(0.2, rel=1e-5)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 2.0, 0.0], [0.0, -2.0, -1.0]]) / 2)
    # dapo stays token-mean: it has no loss_agg_mode option
    dapo, _, _ = _dual("dapo")
    assert dapo.item() == pytest.approx(0.4 / 6, rel=1e-5)
    with pytest.raises(TypeError, match="loss_agg_mode"):
        _dual("dapo", loss_agg_mode="seq-mean-token-sum")


def test_dual_clip_leaves_on_policy_and_positive_advantages_alone():
    # On-policy r = 1: for A < 0 the loss -A = |A| is below the cap c |A| since c > 1.
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(4, 5, generator=gen)
    adv = torch.tensor([[-2.0], [-0.1], [0.5], [3.0]])
    for c in (None, 1.01, 3.0):
        lp = old.clone().requires_grad_(True)
        loss, metrics = get_token_loss("ppo_clip")(clip_ratio_c=c)(TokenLossInput(lp, old, adv))
        loss.backward()
        assert loss.item() == pytest.approx(-adv.mean().item(), rel=1e-6)
        torch.testing.assert_close(lp.grad, (-adv / 20).expand(4, 5))
        if c is not None:
            assert metrics["clipfrac_lower"].item() == 0.0


@pytest.mark.parametrize("name", ["gspo", "cispo", "sapo"])
def test_the_other_losses_do_not_read_clip_ratio_c(name):
    # They have no such option, so setting one is refused rather than silently ignored.
    log_prob = _log(DUAL_RATIOS) * 1e-3  # log-ratios of ~1e-3, so that gspo's ratio is near 1
    common = dict(clip_range=3e-4, clip_range_high=4e-4) if name == "gspo" else dict(clip_range=0.2, clip_range_high=0.2)
    old = torch.zeros(2, 3)
    with pytest.raises(TypeError, match="clip_ratio_c"):
        get_token_loss(name)(clip_ratio_c=1.5, **common)
    _, metrics = get_token_loss(name)(**common)(TokenLossInput(log_prob, old, DUAL_ADV))
    assert "clipfrac_lower" not in metrics


# ------------------------------------------------------------------ seq-mean-token-sum-norm


def test_sum_norm_aggregate_hand_values():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # Token sums 1 + 2 = 3 and 4; the all-masked third row is not a sequence (B = 2); C = 4:
    # (3 + 4) / (2 * 4) = 0.875, which is seq-mean-token-sum 3.5 divided by 4.
    assert aggregate(values, mask, SUM_NORM_MODE, scale=4).item() == pytest.approx(0.875)
    assert aggregate(values, mask, "seq-mean-token-sum").item() == pytest.approx(3.5)
    # No mask, C = 3: (6 + 15 + 24) / (3 * 3) = 5
    assert aggregate(values, None, SUM_NORM_MODE, scale=3).item() == pytest.approx(5.0)
    assert aggregate(values, torch.zeros(3, 3), SUM_NORM_MODE, scale=3).item() == 0.0
    # The constant has no default: Dr.GRPO's C is the response length budget, which only the caller knows.
    with pytest.raises(ValueError, match="'seq-mean-token-sum-norm' divides by a constant, loss_scale_factor"):
        aggregate(values, mask, SUM_NORM_MODE)
    assert SUM_NORM_MODE in ALL_LOSS_AGG_MODES


def test_sum_norm_matches_plain_loop():
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(6, 9, generator=gen)
    mask = (torch.rand(6, 9, generator=gen) > 0.5).float()
    mask[4] = 0.0
    mask[0, 0] = 1.0
    values[mask == 0] = float("nan")
    rows = zip(values.tolist(), mask.tolist())
    sums = [sum(v for v, m in zip(row, keep) if m) for row, keep in rows if any(keep)]
    expected = sum(sums) / (len(sums) * 16)
    assert aggregate(values, mask, SUM_NORM_MODE, scale=16).item() == pytest.approx(expected, rel=1e-5)


def test_ppo_clip_with_sum_norm_hand_values():
    # The shared batch of test_token_losses: ratios [[1.5, 0.5, (pad)], [1.1, 1.0, 0.9]], A = +2, -1,
    # clip [0.8, 1.28]. Per-token losses: -2.56 (1.5 clipped to 1.28), -1.0 (0.5 unclipped, since
    # max(-1, -1.6) = -1), then 1.1, 1.0, 0.9. Token sums -3.56 and 3.0; B = 2, C = 3:
    # (-3.56 + 3.0) / (2 * 3) = -0.56 / 6 = -0.0933333
    log_prob = _log([[1.5, 0.5, 1.0], [1.1, 1.0, 0.9]])
    log_prob[0, 2] = 7.0  # padding
    log_prob.requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    inp = TokenLossInput(log_prob, torch.zeros(2, 3), torch.tensor([[2.0], [-1.0]]), mask=mask)
    loss, metrics = get_token_loss("ppo_clip")(clip_range=0.2, clip_range_high=0.28, loss_agg_mode=SUM_NORM_MODE, loss_scale_factor=3)(inp)
    assert loss.item() == pytest.approx(-0.56 / 6, rel=1e-5)
    loss.backward()
    # Each unclipped token: -A r / (B C) = -A r / 6; the clipped (0,0) and the pad get 0.
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, -1.0, 0.0], [1.1, 1.0, 0.9]]) / 6)


@pytest.mark.parametrize("name", ["ppo_clip", "cispo", "sapo"])
def test_sum_norm_weighs_every_token_the_same_whatever_the_length(name):
    # Dr.GRPO's point: on-policy every valid token gets gradient -A / (B C), here -1 / (2 * 4), in
    # the one-token sequence and in the three-token one alike. seq-mean-token-mean would give the
    # lone token -1 / 2 and the others -1 / 6 each.
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.ones(2, 1)
    lp = old.clone().requires_grad_(True)
    inp = TokenLossInput(lp, old, adv, mask=mask)
    get_token_loss(name)(clip_range=0.2, clip_range_high=0.28, loss_agg_mode=SUM_NORM_MODE, loss_scale_factor=4)(inp)[0].backward()
    torch.testing.assert_close(lp.grad, -mask / 8)


def test_sum_norm_without_the_constant_fails_on_the_first_call():
    log_prob = torch.zeros(2, 3)
    inp = TokenLossInput(log_prob, log_prob, torch.ones(2, 1))
    with pytest.raises(ValueError, match="loss_scale_factor, but it is None"):
        get_token_loss("ppo_clip")(loss_agg_mode=SUM_NORM_MODE)(inp)


def test_the_kl_term_is_aggregated_with_the_same_constant():
    # On-policy, so the policy term is mean(-A) = 0 here; every token's k3 to ref = logp + ln 2 is
    # 2 - ln 2 - 1 = 0.3068528. Two sequences of 2 and 1 valid tokens, C = 4:
    # kl = (2 * 0.3068528 + 0.3068528) / (2 * 4) = 0.1150698
    log_prob = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([[1.0], [-1.0]])
    inp = TokenLossInput(log_prob, log_prob, adv, mask=mask, ref_log_prob=log_prob + math.log(2.0))
    loss, metrics = get_token_loss("ppo_clip")(kl_coef=1.0, loss_agg_mode=SUM_NORM_MODE, loss_scale_factor=4)(inp)
    k3 = 1 - math.log(2.0)
    assert metrics["kl"].item() == pytest.approx(3 * k3 / 8, rel=1e-6)
    # policy term: (-1 - 1 + 1) / 8 = -1 / 8
    assert loss.item() == pytest.approx(-1 / 8 + 3 * k3 / 8, rel=1e-6)


# ------------------------------------------------------------------ kl_clamp


def test_k3_clamp_hand_values_and_gradients():
    # x = ref - logp, k3 = e^x - x - 1, d k3 / d logp = 1 - e^x:
    #   ref ln 2:  k3 = 2 - ln 2 - 1 = 0.3068528 (under 10: kept), gradient 1 - 2 = -1
    #   ref ln 20: k3 = 20 - ln 20 - 1 = 16.0042677 -> 10, gradient 0
    #   ref -30:   k3 = e^-30 + 30 - 1 = 29 -> 10, gradient 0
    #   logp -100: x = 100, e^100 overflows float32 to inf -> 10, gradient 0 (torch.clamp gives NaN)
    log_prob = torch.tensor([[0.0, 0.0, 0.0, -100.0]], requires_grad=True)
    ref = torch.tensor([[math.log(2.0), math.log(20.0), -30.0, 0.0]])
    kl = token_kl(log_prob, ref, "k3", clamp=10.0)
    torch.testing.assert_close(kl, torch.tensor([[1 - math.log(2.0), 10.0, 10.0, 10.0]]))
    kl.sum().backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.0, 0.0, 0.0, 0.0]]))
    unclamped = token_kl(log_prob.detach(), ref, "k3")
    assert unclamped[0, 1].item() == pytest.approx(20 - math.log(20.0) - 1, rel=1e-6)


def test_k1_clamp_is_symmetric():
    # k1 = logp - ref: 15 -> 10, -15 -> -10, 0.5 kept with gradient 1
    log_prob = torch.tensor([[0.0, 0.0, 0.0]], requires_grad=True)
    kl = token_kl(log_prob, torch.tensor([[-15.0, 15.0, -0.5]]), "k1", clamp=10.0)
    torch.testing.assert_close(kl, torch.tensor([[10.0, -10.0, 0.5]]))
    kl.sum().backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, 0.0, 1.0]]))


def test_kl_clamp_in_the_loss():
    # On-policy policy term 0 (A = +1, -1); k3 per token 0.3068528 and 16.0042677 -> 10, token-mean:
    # kl = (0.3068528 + 10) / 2 = 5.1534264; loss = 0.5 * kl
    log_prob = torch.zeros(2, 1, requires_grad=True)
    ref = torch.tensor([[math.log(2.0)], [math.log(20.0)]])
    adv = torch.tensor([[1.0], [-1.0]])
    inp = TokenLossInput(log_prob, log_prob.detach(), adv, ref_log_prob=ref)
    loss, metrics = get_token_loss("ppo_clip")(kl_coef=0.5, kl_clamp=10.0)(inp)
    assert metrics["kl"].item() == pytest.approx((1 - math.log(2.0) + 10) / 2, rel=1e-6)
    assert loss.item() == pytest.approx(0.5 * (1 - math.log(2.0) + 10) / 2, rel=1e-6)
    loss.backward()
    # policy term -A / 2; the kept k3 adds 0.5 * (1 - 2) / 2 = -0.25 on token 0, the clamped one 0.
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.5 - 0.25], [0.5]]))


# ------------------------------------------------------------------ input checks


@pytest.mark.parametrize("field, value, message", [
    ("clip_ratio_c", 1.0, "clip_ratio_c=1.0: expected > 1"),
    ("clip_ratio_c", float("nan"), "clip_ratio_c=nan: expected > 1"),
    ("loss_scale_factor", 0.0, "loss_scale_factor=0.0: expected > 0"),
    ("kl_clamp", -1.0, "kl_clamp=-1.0: expected > 0"),
])
def test_bad_option_values(field, value, message):
    log_prob = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=message):
        get_token_loss("ppo_clip")(**{field: value, **({"loss_agg_mode": SUM_NORM_MODE} if field == "loss_scale_factor" else {})})


# ------------------------------------------------------------------ against verl's conventions


def _verl_style_loss(log_prob, old, adv, mask, lo, hi, c, mode, scale, ref=None, kl_coef=0.0):
    """verl's vanilla loss + agg_loss + low_var_kl, written out from its documented maths (dual clip
    on, log-ratio clamped to [-20, 20], k3 with x clamped to [-20, 20] and then to [-10, 10]). The
    seq modes divide by the number of sequences, as newer verl does."""
    m = mask.float()
    log_ratio = torch.clamp(log_prob - old, -20, 20)
    r = torch.exp(log_ratio)
    l1, l2 = -adv * r, -adv * torch.clamp(r, 1 - lo, 1 + hi)
    clipped = torch.maximum(l1, l2)
    losses = torch.where(adv < 0, torch.minimum(-adv * c, clipped), clipped)

    def agg(x):
        if mode == "token-mean":
            return (x * m).sum() / m.sum()
        sums = (x * m).sum(-1)
        if mode == "seq-mean-token-mean":
            return (sums / m.sum(-1)).mean()
        return sums.mean() / (scale if mode == SUM_NORM_MODE else 1)

    loss = agg(losses)
    if ref is not None:
        x = torch.clamp(ref - log_prob, -20, 20)
        loss = loss + kl_coef * agg(torch.clamp(torch.exp(x) - x - 1, -10, 10))
    return loss


@pytest.mark.parametrize("mode", ALL_LOSS_AGG_MODES)
def test_ppo_clip_with_the_verl_options_matches_verl_conventions(mode):
    # With clip_ratio_c 3, kl_clamp 10, unclamped advantages and every sequence non-empty, ppo_clip
    # agrees with verl's formulas in value and gradient on random tensors, the dual clip, the clip
    # and the KL clamp all binding somewhere.
    gen = torch.Generator().manual_seed(7)
    B, T = 8, 12
    old = torch.randn(B, T, generator=gen) - 2
    base = old + torch.randn(B, T, generator=gen) * 1.5  # log-ratios of +-several: ratios up to e^5
    ref = old + torch.randn(B, T, generator=gen) * 6  # some k3 above 10
    adv = torch.randn(B, 1, generator=gen) * 2
    mask = torch.rand(B, T, generator=gen) > 0.3
    mask[:, 0] = True
    lo, hi, c, scale = 0.2, 0.28, 3.0, 16.0

    ours_lp = base.clone().requires_grad_(True)
    inp = TokenLossInput(ours_lp, old, adv, mask=mask.float(), ref_log_prob=ref)
    loss_fn = get_token_loss("ppo_clip")(
        clip_range=lo, clip_range_high=hi, adv_clip_max=1e9, clip_ratio_c=c, loss_agg_mode=mode, kl_clamp=10.0,
        loss_scale_factor=scale if mode == SUM_NORM_MODE else None, kl_coef=0.1,
    )
    loss, metrics = loss_fn(inp)
    loss.backward()

    verl_lp = base.clone().requires_grad_(True)
    verl = _verl_style_loss(verl_lp, old, adv, mask, lo, hi, c, mode, scale, ref=ref, kl_coef=0.1)
    verl.backward()

    torch.testing.assert_close(loss, verl)
    torch.testing.assert_close(ours_lp.grad, verl_lp.grad)
    assert 0 < metrics["clipfrac_lower"] < 1  # the dual clip binds on some tokens
    assert bool((token_kl(base, ref, "k3")[mask] > 10).any())  # and so does the KL clamp

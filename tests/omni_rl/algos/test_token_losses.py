"""Tests for omni_rl.algos.token_losses: aggregation modes against loops, hand values of every loss
on one 2x3 batch, on-policy REINFORCE anchors, masked tokens, GSPO's token form vs its sequence
form, CISPO's stopped weight, SAPO's gate, the k1/k3 KL estimates, registry and input errors."""
import dataclasses
import math

import pytest
import torch

import omni_rl.algos  # noqa: F401  (registers the token losses)
from omni_rl.algos.policy_losses import DIFFUSION_LOSSES
from omni_rl.algos.token_losses import TOKEN_LOSSES, TokenLossInput, get_token_loss
from omni_rl.algos.token_losses import LOSS_AGG_MODES, aggregate, sapo_gate, token_kl
from omni_rl.registry import RegistryError

TOKEN_LOSS_NAMES = ["ppo_clip", "dapo", "gspo", "cispo", "sapo"]
METRIC_KEYS = {"policy_loss", "clipfrac", "approx_kl", "ratio_mean", "ratio_std", "ratio_max_abs_dev"}
# The aggregation each loss uses when loss_agg_mode is `mode`.
EFFECTIVE_MODE = {
    "ppo_clip": lambda mode: mode,
    "cispo": lambda mode: mode,
    "sapo": lambda mode: mode,
    "dapo": lambda mode: "token-mean",
    "gspo": lambda mode: "seq-mean-token-mean",
}
# GSPO's clip range is ~1e3 smaller than the token losses' (its ratio is a per-token mean).
CLIP = {"gspo": (3e-4, 4e-4)}
DAPO_CLIP = (0.2, 0.28)


def build(name, **knobs):
    """The token loss `name` built with `knobs`, loss_agg_mode only where the loss has that option
    (dapo and gspo fix their aggregation: they have none)."""
    cls = get_token_loss(name)
    if "loss_agg_mode" not in {f.name for f in dataclasses.fields(cls.Options)}:
        knobs.pop("loss_agg_mode", None)
    return cls(**knobs)


def _clip(name):
    return CLIP.get(name, DAPO_CLIP)


def _check_metrics(metrics, keys=METRIC_KEYS):
    assert set(metrics) == keys
    for key, value in metrics.items():
        assert value.ndim == 0 and not value.requires_grad, key


# The shared 2x3 batch: ratios r = [[1.5, 0.5, (masked)], [1.1, 1.0, 0.9]], old log-probs 0,
# A = +2 for sequence 0 and -1 for sequence 1. Token (0, 2) is padding and holds garbage.
RATIOS = [[1.5, 0.5, 1.0], [1.1, 1.0, 0.9]]
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADV = torch.tensor([[2.0], [-1.0]])


def _batch():
    log_prob = torch.tensor([[math.log(r) for r in row] for row in RATIOS])
    log_prob[0, 2] = 7.0  # masked: must not matter
    return log_prob.requires_grad_(True), torch.zeros(2, 3)


# ------------------------------------------------------------------ aggregate


def test_aggregate_hand_values():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # token-mean: (1 + 2 + 4) / 3; seq-mean-token-mean: ((1 + 2) / 2 + 4 / 1) / 2 = 2.75;
    # seq-mean-token-sum: (3 + 4) / 2 = 3.5
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(7 / 3)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(2.75)
    assert aggregate(values, mask, "seq-mean-token-sum").item() == pytest.approx(3.5)
    # No mask: every token counts. token-mean 21 / 6; seq-mean-token-mean (2 + 5) / 2; sum (6 + 15) / 2
    assert aggregate(values, None, "token-mean").item() == pytest.approx(3.5)
    assert aggregate(values, None, "seq-mean-token-mean").item() == pytest.approx(3.5)
    assert aggregate(values, None, "seq-mean-token-sum").item() == pytest.approx(10.5)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregate_matches_plain_loop(mode):
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(5, 7, generator=gen)
    mask = (torch.rand(5, 7, generator=gen) > 0.4).float()
    mask[2] = 0.0  # a sequence without a valid token: left out of the sequence means
    mask[0, 0] = 1.0
    values[mask == 0] = float("nan")  # masked garbage must not leak
    token_total, token_count, seq_values = 0.0, 0, []
    for row, keep in zip(values.tolist(), mask.tolist()):
        kept = [v for v, m in zip(row, keep) if m]
        token_total += sum(kept)
        token_count += len(kept)
        if kept:
            seq_values.append(sum(kept) / len(kept) if mode == "seq-mean-token-mean" else sum(kept))
    expected = token_total / token_count if mode == "token-mean" else sum(seq_values) / len(seq_values)
    assert aggregate(values, mask, mode).item() == pytest.approx(expected, rel=1e-5)
    assert aggregate(values, torch.zeros(5, 7), mode).item() == 0.0  # nothing valid: 0


def test_aggregate_errors():
    expected = "'tokenmean' is unknown; expected one of token-mean, seq-mean-token-mean, seq-mean-token-sum"
    with pytest.raises(ValueError, match=expected):
        aggregate(torch.zeros(2, 3), None, "tokenmean")
    with pytest.raises(ValueError, match=r"per-token values \[B, T\]"):
        aggregate(torch.zeros(3), None, "token-mean")
    with pytest.raises(ValueError, match="mask has shape"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 2), "token-mean")


# ------------------------------------------------------------------ ppo_clip and dapo


@pytest.mark.parametrize(
    "mode, expected",
    [
        # Per-token losses, clip range [0.8, 1.28]:
        #   (0,0) r 1.5, A 2: clipped to 1.28, max(-3, -2.56) = -2.56
        #   (0,1) r 0.5, A 2: clipped to 0.8,  max(-1, -1.6)  = -1.0
        #   (1,0) r 1.1, A -1: 1.1;  (1,1) r 1, A -1: 1.0;  (1,2) r 0.9, A -1: 0.9
        ("token-mean", (-2.56 - 1.0 + 1.1 + 1.0 + 0.9) / 5),  # -0.112
        ("seq-mean-token-mean", ((-2.56 - 1.0) / 2 + (1.1 + 1.0 + 0.9) / 3) / 2),  # -0.39
        ("seq-mean-token-sum", ((-2.56 - 1.0) + (1.1 + 1.0 + 0.9)) / 2),  # -0.28
    ],
)
def test_ppo_clip_hand_values(mode, expected):
    log_prob, old = _batch()
    inp = TokenLossInput(log_prob, old, ADV, mask=MASK)
    loss, metrics = get_token_loss("ppo_clip")(clip_range=0.2, clip_range_high=0.28, loss_agg_mode=mode)(inp)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    _check_metrics(metrics)
    assert metrics["policy_loss"].item() == pytest.approx(expected, rel=1e-5)
    assert metrics["clipfrac"].item() == pytest.approx(2 / 5)  # 1.5 and 0.5 are outside
    assert metrics["ratio_mean"].item() == pytest.approx(1.0)  # (1.5 + 0.5 + 1.1 + 1 + 0.9) / 5
    ratio_var = (0.25 + 0.25 + 0.01 + 0 + 0.01) / 5
    assert metrics["ratio_std"].item() == pytest.approx(math.sqrt(ratio_var), rel=1e-5)
    assert metrics["ratio_max_abs_dev"].item() == pytest.approx(0.5, rel=1e-5)
    logs = [math.log(r) for r in (1.5, 0.5, 1.1, 1.0, 0.9)]
    assert metrics["approx_kl"].item() == pytest.approx(0.5 * sum(x * x for x in logs) / 5, rel=1e-5)
    if mode == "token-mean":
        loss.backward()
        # d/dlogp (-A r) = -A r where the unclipped branch is the max, 0 where the clip bites:
        # (0,0) clipped -> 0; (0,1) -2 * 0.5 / 5; (1,*) r / 5; the masked token 0.
        expected_grad = torch.tensor([[0.0, -0.2, 0.0], [0.22, 0.2, 0.18]])
        torch.testing.assert_close(log_prob.grad, expected_grad)


def test_dapo_is_ppo_clip_with_token_mean_whatever_the_field():
    log_prob, old = _batch()
    common = dict(clip_range=0.2, clip_range_high=0.28)
    dapo_input = TokenLossInput(log_prob, old, ADV, mask=MASK)
    dapo, _ = get_token_loss("dapo")(**common)(dapo_input)
    ppo, _ = get_token_loss("ppo_clip")(loss_agg_mode="token-mean", **common)(TokenLossInput(
        log_prob, old, ADV, mask=MASK))
    assert dapo.item() == pytest.approx(-0.112, rel=1e-5)
    torch.testing.assert_close(dapo, ppo)


# ------------------------------------------------------------------ gspo


def test_gspo_hand_values():
    log_prob, old = _batch()
    inp = TokenLossInput(log_prob, old, ADV, mask=MASK)
    loss, metrics = get_token_loss("gspo")(clip_range=3e-4, clip_range_high=4e-4)(inp)
    # s_0 = exp((ln 1.5 + ln 0.5) / 2) = sqrt(0.75) = 0.8660254, A 2: max(-2 s_0, -2 * 0.9997) = -2 s_0
    # s_1 = exp((ln 1.1 + 0 + ln 0.9) / 3) = 0.99^(1/3) = 0.9966556, A -1: max(s_1, 0.9997) = 0.9997
    # seq-mean-token-mean of per-token values constant within a sequence: (-1.7320508 + 0.9997) / 2
    s0, s1 = math.sqrt(0.75), 0.99 ** (1 / 3)
    expected = (-2 * s0 + 0.9997) / 2  # = -0.3661754
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    _check_metrics(metrics)
    assert metrics["clipfrac"].item() == 1.0  # both sequences' ratios are outside [0.9997, 1.0004]
    assert metrics["ratio_mean"].item() == pytest.approx((s0 + s1) / 2, rel=1e-5)
    assert metrics["ratio_max_abs_dev"].item() == pytest.approx(1 - s0, rel=1e-5)
    loss.backward()
    # Sequence 0 is unclipped: d/dlogp_t = -A s_0 / |y_0| / B = -2 * 0.8660254 / 2 / 2 on its two
    # valid tokens. Sequence 1 takes the clipped branch: 0.
    expected_grad = torch.tensor([[-s0 / 2, -s0 / 2, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(log_prob.grad, expected_grad)


def test_gspo_token_form_equals_sequence_form_value_and_gradient():
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(6, 5, generator=gen) * 2e-3
    old = torch.randn(6, 5, generator=gen) * 2e-3
    adv = torch.randn(6, 1, generator=gen)
    mask = (torch.rand(6, 5, generator=gen) > 0.3).float()
    mask[:, 0] = 1.0
    lo, hi = 3e-4, 4e-4

    token_lp = base.clone().requires_grad_(True)
    inp = TokenLossInput(token_lp, old, adv, mask=mask)
    loss, metrics = get_token_loss("gspo")(clip_range=lo, clip_range_high=hi)(inp)
    loss.backward()

    # Sequence form: s_i = exp(masked mean of the log-ratio), loss = mean_i max(-A s_i, -A clip(s_i)).
    seq_lp = base.clone().requires_grad_(True)
    s = torch.exp(((seq_lp - old) * mask).sum(-1) / mask.sum(-1))
    a = adv.squeeze(-1)
    seq_loss = torch.maximum(-a * s, -a * s.clamp(1 - lo, 1 + hi)).mean()
    seq_loss.backward()

    torch.testing.assert_close(loss, seq_loss)
    torch.testing.assert_close(token_lp.grad, seq_lp.grad)
    outside = ((s < 1 - lo) | (s > 1 + hi)).float().mean()
    torch.testing.assert_close(metrics["clipfrac"], outside)
    assert 0 < outside < 1  # the case exercises both branches


# ------------------------------------------------------------------ cispo


def test_cispo_hand_values_and_gradient_only_through_log_prob():
    log_prob, old = _batch()
    inp = TokenLossInput(log_prob, old, ADV, mask=MASK)
    loss, metrics = get_token_loss("cispo")(clip_range=0.2, clip_range_high=0.28)(inp)
    # Weights sg(clip(r, 0.8, 1.28)) = [[1.28, 0.8], [1.1, 1.0, 0.9]]; per token -w A logp:
    #   (0,0) -1.28 * 2 * ln 1.5 = -1.0379907     (0,1) -0.8 * 2 * ln 0.5 = 1.1090355
    #   (1,0)  1.1 * ln 1.1     =  0.1048412     (1,1) 0                (1,2) 0.9 * ln 0.9 = -0.0948245
    expected = (-2.56 * math.log(1.5) - 1.6 * math.log(0.5) + 1.1 * math.log(1.1) + 0.9 * math.log(0.9)) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-5)  # 0.0162123
    _check_metrics(metrics)
    assert metrics["clipfrac"].item() == pytest.approx(2 / 5)
    loss.backward()
    # The gradient is -w A / 5 per token: the weight is a constant, and unlike ppo_clip the clipped
    # tokens (0,0) and (0,1) still get one. Had the weight carried gradient, d/dlogp(-r A logp)
    # would be -A r (1 + logp) instead.
    expected_grad = torch.tensor([[-2.56, -1.6, 0.0], [1.1, 1.0, 0.9]]) / 5
    torch.testing.assert_close(log_prob.grad, expected_grad)


# ------------------------------------------------------------------ sapo


@pytest.mark.parametrize(
    "ratio, tau, expected",
    [
        (1.0, 1.0, 2.0),  # f(1) = (4 / tau) * 0.5 = 2 / tau
        (1.0, 1.05, 2 / 1.05),  # 1.9047619
        (1.1, 1.0, 4 / (1 + math.exp(-0.1))),  # 4 * sigmoid(0.1) = 2.0999167
        (1.1, 1.05, (4 / 1.05) / (1 + math.exp(-0.105))),  # 3.8095238 * sigmoid(0.105) = 2.0046701
    ],
)
def test_sapo_gate_values(ratio, tau, expected):
    assert sapo_gate(torch.tensor(ratio), tau).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("tau", [1.0, 1.05, 3.0])
def test_sapo_gate_slope_is_one_at_ratio_one(tau):
    # f'(r) = 4 sigmoid(x) (1 - sigmoid(x)), x = tau (r - 1): 4 * 0.25 = 1 at r = 1, the slope of r A.
    r = torch.tensor(1.0, requires_grad=True)
    sapo_gate(r, tau).backward()
    assert r.grad.item() == pytest.approx(1.0, rel=1e-6)


def test_sapo_picks_the_temperature_by_the_sign_of_the_advantage():
    # Two one-token sequences at r = 1.1: A = +1 uses tau_pos 1, A = -1 uses tau_neg 1.05.
    log_prob = torch.full((2, 1), math.log(1.1))
    adv = torch.tensor([[1.0], [-1.0]])
    loss, _ = get_token_loss("sapo")()(TokenLossInput(log_prob, torch.zeros(2, 1), adv))
    # -(+1) * 2.0999167 and -(-1) * 2.0046701, token-mean
    expected = (-4 / (1 + math.exp(-0.1)) + (4 / 1.05) / (1 + math.exp(-0.105))) / 2  # -0.0476233
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_sapo_on_the_shared_batch_matches_a_loop():
    log_prob, old = _batch()
    inp = TokenLossInput(log_prob, old, ADV, mask=MASK)
    loss, metrics = get_token_loss("sapo")(clip_range=0.2, clip_range_high=0.28)(inp)
    total = 0.0
    for row, a in zip(RATIOS, (2.0, -1.0)):
        tau = 1.0 if a > 0 else 1.05
        for j, r in enumerate(row):
            if row is RATIOS[0] and j == 2:
                continue  # masked
            total += -(4 / tau) / (1 + math.exp(-tau * (r - 1))) * a
    assert loss.item() == pytest.approx(total / 5, rel=1e-5)
    assert metrics["clipfrac"].item() == pytest.approx(2 / 5)  # a diagnostic: sapo does not clip


# ------------------------------------------------------------------ all token losses


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", TOKEN_LOSS_NAMES)
def test_on_policy_ratio_one_and_reinforce_gradient(name, mode):
    # Before any update r = exp(0) = 1 exactly, nothing is clipped, and every loss's gradient is
    # REINFORCE's: d/dlogp of agg(-A logp) with the aggregation the loss uses.
    gen = torch.Generator().manual_seed(2)
    old = torch.randn(3, 4, generator=gen)
    adv = torch.tensor([[1.5], [-0.5], [7.0]])  # 7 is clamped to adv_clip_max 5
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    log_prob = old.clone().requires_grad_(True)
    low, high = _clip(name)
    inp = TokenLossInput(log_prob, old, adv, mask=mask)
    loss, metrics = build(name, clip_range=low, clip_range_high=high, loss_agg_mode=mode)(inp)
    assert metrics["ratio_mean"].item() == 1.0
    assert metrics["ratio_std"].item() == 0.0
    assert metrics["ratio_max_abs_dev"].item() == 0.0
    assert metrics["clipfrac"].item() == 0.0 and metrics["approx_kl"].item() == 0.0
    loss.backward()
    reinforce_lp = old.clone().requires_grad_(True)
    aggregate(-adv.clamp(-5, 5) * reinforce_lp, mask, EFFECTIVE_MODE[name](mode)).backward()
    torch.testing.assert_close(log_prob.grad, reinforce_lp.grad)


@pytest.mark.parametrize("name", TOKEN_LOSS_NAMES)
def test_masked_tokens_change_nothing(name):
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(3, 5, generator=gen) * 0.2
    old = torch.randn(3, 5, generator=gen) * 0.2
    ref = torch.randn(3, 5, generator=gen) * 0.2
    adv = torch.randn(3, 1, generator=gen)
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    low, high = _clip(name)

    def run(lp_values, old_values, ref_values):
        lp = lp_values.clone().requires_grad_(True)
        inp = TokenLossInput(lp, old_values, adv, mask=mask, ref_log_prob=ref_values)
        loss, metrics = get_token_loss(name)(clip_range=low, clip_range_high=high, kl_coef=0.1)(inp)
        loss.backward()
        return loss, metrics, lp.grad

    loss, metrics, grad = run(base, old, ref)
    pad = mask == 0
    garbage_lp, garbage_old, garbage_ref = base.clone(), old.clone(), ref.clone()
    garbage_lp[pad], garbage_old[pad], garbage_ref[pad] = 1e4, -float("inf"), float("nan")
    loss2, metrics2, grad2 = run(garbage_lp, garbage_old, garbage_ref)
    torch.testing.assert_close(loss2, loss)
    for key in metrics:
        torch.testing.assert_close(metrics2[key], metrics[key], msg=key)
    torch.testing.assert_close(grad2, grad)
    assert bool((grad[pad] == 0).all())


@pytest.mark.parametrize("name", TOKEN_LOSS_NAMES)
def test_advantages_are_clamped_like_flow_grpo(name):
    log_prob = torch.full((2, 2), -0.5)  # not 0: cispo's loss value is proportional to log_prob
    low, high = _clip(name)
    big, five = torch.tensor([[50.0], [-1.0]]), torch.tensor([[5.0], [-1.0]])

    def loss(adv, **kwargs):
        inp = TokenLossInput(log_prob, log_prob, adv)
        return get_token_loss(name)(clip_range=low, clip_range_high=high, **kwargs)(inp)[0]

    torch.testing.assert_close(loss(big), loss(five))  # adv_clip_max defaults to 5
    assert loss(big, adv_clip_max=1e9).item() != pytest.approx(loss(five).item())


# ------------------------------------------------------------------ KL to the reference


def test_k1_k3_hand_values():
    # logp = 0, ref = ln 2 (x = ref - logp = ln 2): k1 = -ln 2, k3 = 2 - ln 2 - 1 = 0.3068528
    # logp = ln 2, ref = 0 (x = -ln 2):             k1 = ln 2,  k3 = 0.5 + ln 2 - 1 = 0.1931472
    log_prob = torch.tensor([[0.0, math.log(2.0)]])
    ref = torch.tensor([[math.log(2.0), 0.0]])
    ln2 = math.log(2.0)
    torch.testing.assert_close(token_kl(log_prob, ref, "k1"), torch.tensor([[-ln2, ln2]]))
    torch.testing.assert_close(token_kl(log_prob, ref, "k3"), torch.tensor([[1 - ln2, ln2 - 0.5]]))
    with pytest.raises(ValueError, match="'k2' is unknown; expected one of k1, k3"):
        token_kl(log_prob, ref, "k2")


def test_k1_and_k3_are_unbiased_estimates_of_kl():
    # Averaged over tokens drawn from pi (here: enumerated with weights pi), both give KL(pi || ref).
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    exact = (pi * (pi.log() - ref.log())).sum()
    for estimator in ("k1", "k3"):
        per_token = token_kl(pi.log()[None], ref.log()[None], estimator)[0]
        torch.testing.assert_close((pi * per_token).sum(), exact)
    assert bool((token_kl(pi.log(), ref.log(), "k3") >= 0).all())  # k3 is >= 0 per token, k1 is not


def test_kl_term_is_added_with_its_coefficient():
    log_prob = torch.zeros(2, 2, requires_grad=True)
    ref = torch.full((2, 2), math.log(2.0), requires_grad=True)
    adv = torch.tensor([[1.0], [-1.0]])
    inp = TokenLossInput(log_prob, log_prob.detach(), adv, ref_log_prob=ref)
    loss, metrics = get_token_loss("ppo_clip")(kl_coef=0.5, kl_estimator="k3")(inp)
    # On-policy the policy term is mean(-A) = 0; every token's k3 is 1 - ln 2 = 0.3068528.
    _check_metrics(metrics, METRIC_KEYS | {"kl"})
    assert metrics["policy_loss"].item() == 0.0
    assert metrics["kl"].item() == pytest.approx(1 - math.log(2.0), rel=1e-6)
    assert loss.item() == pytest.approx(0.5 * (1 - math.log(2.0)), rel=1e-6)
    loss.backward()
    # d/dlogp of 0.5 * mean(e^(ref - logp) - (ref - logp) - 1) = 0.5 * (1 - 2) / 4 for each token,
    # plus the policy term -A / 4.
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.375, -0.375], [0.125, 0.125]]))
    assert ref.grad is None
    # kl_coef 0 with a reference: the KL is reported, not added.
    inp = TokenLossInput(log_prob, log_prob.detach(), adv, ref_log_prob=ref)
    loss, metrics = get_token_loss("ppo_clip")()(inp)
    assert loss.item() == 0.0 and "kl" in metrics
    with pytest.raises(ValueError, match="kl_coef=0.1 > 0 but ref_log_prob is None"):
        get_token_loss("ppo_clip")(kl_coef=0.1)(TokenLossInput(log_prob, log_prob.detach(), adv))


# ------------------------------------------------------------------ registry and input checks


def test_unknown_loss_lists_every_registered_token_loss():
    assert TOKEN_LOSSES.names() == sorted(TOKEN_LOSS_NAMES)
    with pytest.raises(RegistryError) as info:
        get_token_loss("grpo")
    assert "token loss" in str(info.value)
    for name in TOKEN_LOSS_NAMES:
        assert name in str(info.value)


def test_token_and_diffusion_losses_are_registered_apart():
    """A token loss is no diffusion loss and the reverse: each family looks in its own registry."""
    assert not set(TOKEN_LOSSES.names()) & set(DIFFUSION_LOSSES.names())
    with pytest.raises(RegistryError, match="unknown token loss 'flow_grpo'"):
        get_token_loss("flow_grpo")


def test_token_input_checks():
    z23, ones = torch.zeros(2, 3), torch.ones(2, 1)
    with pytest.raises(ValueError, match=r"'ppo_clip' scores tokens: log_prob has shape \(4,\), expected \[B, T"):
        get_token_loss("ppo_clip")()(TokenLossInput(torch.zeros(4), torch.zeros(4), torch.zeros(4)))
    # [B] advantages with B == T would broadcast along the tokens: refused.
    with pytest.raises(ValueError, match=r"Pass advantages\[:, None\]"):
        square = torch.zeros(3, 3)
        get_token_loss("gspo")()(TokenLossInput(square, square, torch.tensor([1.0, 0.0, -1.0])))
    with pytest.raises(ValueError, match="loss_agg_mode='mean' is unknown"):
        get_token_loss("cispo")(loss_agg_mode="mean")(TokenLossInput(z23, z23, ones))
    with pytest.raises(ValueError, match="kl_estimator='kl' is unknown"):
        get_token_loss("sapo")(kl_estimator="kl")(TokenLossInput(z23, z23, ones))
    with pytest.raises(ValueError, match="ref_log_prob has shape"):
        TokenLossInput(z23, z23, ones, ref_log_prob=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="kl_coef=-1"):
        get_token_loss("ppo_clip")(kl_coef=-1)
    with pytest.raises(ValueError, match="tau_pos=0"):
        get_token_loss("sapo")(tau_pos=0)

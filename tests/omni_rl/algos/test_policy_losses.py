"""Tests for omni_rl.algos.policy_losses: hand values, loops, on-policy anchors, masks, Flow-DPPO's
drop rule, GRPO-Guard's ratio, the KL forms."""
import math

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from omni_rl.algos.flow_sde import gaussian_log_prob
from omni_rl.algos.policy_losses import (
    DIFFUSION_KL,
    DIFFUSION_LOSSES,
    ClippedStepOptions,
    StepLossInput,
    exact_kl,
    flow_grpo_code_kl,
    get_diffusion_kl,
    get_diffusion_loss,
    guard_log_ratio,
)
from omni_rl.registry import RegistryError

E = math.e
RATIO_KEYS = {"approx_kl", "ratio_mean", "ratio_std", "ratio_max_abs_dev", "policy_loss"}


def _check_metrics(metrics, keys):
    assert set(metrics) == keys
    for key, value in metrics.items():
        assert value.ndim == 0 and not value.requires_grad, key


# ------------------------------------------------------------------ flow_grpo


def test_flow_grpo_hand_values():
    old = torch.zeros(4)
    log_prob = torch.tensor([1.0, 0.0, -1.0, -1.0])
    adv = torch.tensor([2.0, -1.0, 10.0, -3.0])
    loss, metrics = get_diffusion_loss("flow_grpo")()(StepLossInput(log_prob, old, adv))
    # entry 0: ratio will be e, clipped to 1.0001; A = 2: max(-2e, -2.0002) = -2.0002
    # entry 1: ratio 1, A = -1: 1
    # entry 2: ratio 1/e, clipped to 0.9999; A = 10 clamped to 5: max(-5/e, -4.9995) = -5/e = -1.8393972
    # entry 3: ratio 1/e, A = -3: max(3/e, 2.9997) = 2.9997
    expected = (-2.0002 + 1.0 - 5 / E + 2.9997) / 4  # = 0.0400257
    torch.testing.assert_close(loss, torch.tensor(expected))
    _check_metrics(metrics, RATIO_KEYS | {"clipfrac"})
    # ratios e, 1, 1/e, 1/e: three outside [0.9999, 1.0001]
    assert metrics["clipfrac"].item() == pytest.approx(0.75)
    assert metrics["approx_kl"].item() == pytest.approx(0.5 * 3 / 4)
    assert metrics["ratio_mean"].item() == pytest.approx((E + 1 + 2 / E) / 4, rel=1e-6)
    assert metrics["ratio_max_abs_dev"].item() == pytest.approx(E - 1, rel=1e-6)
    assert metrics["policy_loss"].item() == pytest.approx(expected, rel=1e-6)


def test_flow_grpo_matches_plain_loop():
    gen = torch.Generator().manual_seed(0)
    log_prob = torch.randn(32, generator=gen) * 2e-4
    old = torch.randn(32, generator=gen) * 2e-4
    adv = torch.randn(32, generator=gen) * 4
    mask = (torch.rand(32, generator=gen) > 0.3).float()
    inp = StepLossInput(log_prob, old, adv, mask=mask)
    loss, metrics = get_diffusion_loss("flow_grpo")(clip_range=1e-4, clip_range_high=2e-4, adv_clip_max=5.0)(inp)
    total, count, clipped = 0.0, 0, 0
    for lp, o, a, m in zip(log_prob.tolist(), old.tolist(), adv.tolist(), mask.tolist()):
        if not m:
            continue
        a = min(max(a, -5.0), 5.0)
        rho = math.exp(lp - o)
        total += max(-a * rho, -a * min(max(rho, 1 - 1e-4), 1 + 2e-4))
        clipped += rho < 1 - 1e-4 or rho > 1 + 2e-4
        count += 1
    assert loss.item() == pytest.approx(total / count, rel=1e-5)
    assert metrics["clipfrac"].item() == pytest.approx(clipped / count)


def test_on_policy_ratio_is_exactly_one_and_gradient_is_minus_mean_advantage():
    # Flow-GRPO's anchor: before any update, rho = exp(0) = 1 exactly, nothing is clipped, and
    # d loss / d theta = -mean(A * d logp / d theta).
    old = torch.tensor([-0.3, 0.2, 0.05, 1.1])
    adv = torch.tensor([1.5, -0.5, 7.0, -2.0])  # 7 is clamped to 5
    features = torch.tensor([1.0, 2.0, -1.0, 0.5])
    theta = torch.zeros((), requires_grad=True)
    log_prob = old + theta * features  # logp(theta); on-policy at theta = 0
    loss, metrics = get_diffusion_loss("flow_grpo")()(StepLossInput(log_prob, old, adv))
    assert metrics["ratio_mean"].item() == 1.0
    assert metrics["ratio_std"].item() == 0.0
    assert metrics["ratio_max_abs_dev"].item() == 0.0
    assert metrics["clipfrac"].item() == 0.0 and metrics["approx_kl"].item() == 0.0
    loss.backward()
    clamped = adv.clamp(-5, 5)
    torch.testing.assert_close(theta.grad, -(clamped * features).mean())


def test_mask_equals_loss_on_the_kept_subset():
    gen = torch.Generator().manual_seed(1)
    log_prob, old, adv = torch.randn(3, 10, generator=gen) * 1e-4
    mask = torch.zeros(10)
    mask[[0, 3, 4, 9]] = 1
    masked, masked_metrics = get_diffusion_loss("flow_grpo")()(StepLossInput(log_prob, old, adv, mask=mask))
    keep = mask.bool()
    subset_input = StepLossInput(log_prob[keep], old[keep], adv[keep])
    subset, subset_metrics = get_diffusion_loss("flow_grpo")()(subset_input)
    torch.testing.assert_close(masked, subset)
    for key in subset_metrics:
        torch.testing.assert_close(masked_metrics[key], subset_metrics[key], msg=key)
    # A blown-up entry that is masked out does not leak inf/NaN into the loss.
    log_prob[1] = 1e4
    loss, _ = get_diffusion_loss("flow_grpo")()(StepLossInput(log_prob, old, adv, mask=mask))
    torch.testing.assert_close(loss, subset)
    # All-zero mask: loss 0.
    loss, _ = get_diffusion_loss("flow_grpo")()(StepLossInput(log_prob, old, adv, mask=torch.zeros(10)))
    assert loss.item() == 0.0


def test_token_shaped_entries():
    log_prob = torch.zeros(2, 3)
    adv = torch.tensor([[1.0], [-1.0]])  # one advantage per sequence, broadcast over tokens
    loss, _ = get_diffusion_loss("flow_grpo")()(StepLossInput(log_prob, log_prob.clone(), adv))
    assert loss.item() == 0.0
    with pytest.raises(ValueError, match=r"pass advantages\[:, None\]"):
        StepLossInput(log_prob, log_prob.clone(), torch.tensor([1.0, -1.0]))


# ------------------------------------------------------------------ flow_dppo


def _dppo_case():
    # Five (sample, step) entries, latents [5, 1, 2, 2], s = 0.1 for all.
    # mean - old_mean = 0 for entry 0 (D = 0) and 0.01 everywhere for the others:
    # D = 0.01^2 / (2 * 0.1^2) = 5e-3 >= tau = 1e-5.
    old_mean = torch.zeros(5, 1, 2, 2)
    mean = torch.full((5, 1, 2, 2), 0.01)
    mean[0] = 0.0
    std = torch.full((5,), 0.1)
    old = torch.zeros(5)
    log_prob = torch.tensor([0.5, 0.5, -0.5, 0.5, -0.5])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0])
    # 0: inside the region                         -> kept
    # 1: rho > 1, A > 0, outside: pushes further   -> dropped
    # 2: rho < 1, A < 0, outside: pushes further   -> dropped
    # 3: rho > 1, A < 0: the gradient pulls back   -> kept
    # 4: rho < 1, A > 0: pulls back                -> kept
    return log_prob, old, adv, mean, old_mean, std


def test_flow_dppo_drop_rule_hand_case():
    log_prob, old, adv, mean, old_mean, std = _dppo_case()
    log_prob.requires_grad_(True)
    inp = StepLossInput(log_prob, old, adv, mean=mean, old_mean=old_mean, std=std)
    loss, metrics = get_diffusion_loss("flow_dppo")(kl_threshold=1e-5)(inp)
    r = math.exp(0.5)
    # kept terms -A rho: -r (entry 0), +r (entry 3), -1/r (entry 4); dropped count as 0 in the mean.
    expected = (-r + r - 1 / r) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    _check_metrics(metrics, RATIO_KEYS | {"dropfrac"})
    assert metrics["dropfrac"].item() == pytest.approx(2 / 5)
    loss.backward()
    # d(-A rho)/d logp = -A rho / 5 on kept entries, 0 on dropped ones.
    expected_grad = torch.tensor([-r, 0.0, 0.0, r, -1 / r]) / 5
    torch.testing.assert_close(log_prob.grad, expected_grad)


def test_flow_dppo_no_drop_below_threshold():
    log_prob, old, adv, mean, old_mean, std = _dppo_case()
    inp = StepLossInput(log_prob, old, adv, mean=mean, old_mean=old_mean, std=std)
    loss, metrics = get_diffusion_loss("flow_dppo")(kl_threshold=1e-2)(inp)
    assert metrics["dropfrac"].item() == 0.0
    torch.testing.assert_close(loss, (-adv * log_prob.exp()).mean())


# ------------------------------------------------------------------ grpo_guard


def test_guard_log_ratio_is_noise_dot_mean_shift():
    # prev = old_mean + s eps; then s (logp - old) + mean(dmu^2) / (2 s) = mean(eps * (mean - old_mean)).
    gen = torch.Generator().manual_seed(2)
    old_mean = torch.randn(3, 2, 4, 4, generator=gen)
    mean = old_mean + 0.05 * torch.randn(3, 2, 4, 4, generator=gen)
    std = torch.tensor([0.3, 0.1, 0.0])
    eps = torch.randn(3, 2, 4, 4, generator=gen)
    prev = old_mean + std.reshape(-1, 1, 1, 1) * eps
    log_ratio = guard_log_ratio(
        gaussian_log_prob(prev, mean, std), gaussian_log_prob(prev, old_mean, std), mean, old_mean, std
    )
    expected = (eps * (mean - old_mean)).flatten(1).mean(1)
    expected[2] = 0.0  # s == 0: no action, log-ratio 0
    torch.testing.assert_close(log_ratio, expected, atol=1e-5, rtol=1e-4)


def test_grpo_guard_on_policy_and_dt_weight():
    # On-policy: mean == old_mean and logp == old, so the guard ratio is exactly 1.
    # Loss per entry is w * (-A) with w = 1 / (-dt): entry 0 dt -0.5 -> w 2, entry 1 dt -0.25 -> w 4.
    # loss = (2 * -1 + 4 * 0.5) / 2 = 0.
    old_mean = torch.randn(2, 1, 3, 3)
    old = torch.tensor([0.2, -0.4])
    adv = torch.tensor([1.0, -0.5])
    mean = old_mean.clone().requires_grad_(True)
    std, dt = torch.tensor([0.2, 0.1]), torch.tensor([-0.5, -0.25])
    inp = StepLossInput(old.clone(), old, adv, mean=mean, old_mean=old_mean, std=std, dt=dt)
    loss, metrics = get_diffusion_loss("grpo_guard")()(inp)
    assert loss.item() == 0.0
    _check_metrics(metrics, RATIO_KEYS | {"clipfrac"})
    assert metrics["ratio_mean"].item() == 1.0 and metrics["clipfrac"].item() == 0.0
    # Off-policy hand case, one entry: dt = -0.5 (w = 2), A = 1, guard log-ratio 1 -> ratio e,
    # clipped to 1.0001: loss = 2 * max(-e, -1.0001) = -2.0002. Make the log-ratio 1 with
    # mean == old_mean and s (logp - old) = 0.5 * 2 = 1.
    inp = StepLossInput(
        torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([1.0]), mean=torch.zeros(1, 1, 2),
        old_mean=torch.zeros(1, 1, 2), std=torch.tensor([0.5]), dt=-0.5)
    loss, metrics = get_diffusion_loss("grpo_guard")()(inp)
    assert loss.item() == pytest.approx(-2.0002, rel=1e-6)
    assert metrics["clipfrac"].item() == 1.0


def test_grpo_guard_with_equal_dt_is_flow_grpo_on_the_guard_ratio_times_weight():
    gen = torch.Generator().manual_seed(3)
    old_mean = torch.randn(4, 2, 3, generator=gen)
    mean = old_mean + 1e-3 * torch.randn(4, 2, 3, generator=gen)
    std = torch.full((4,), 0.2)
    log_prob, old, adv = torch.randn(3, 4, generator=gen) * 1e-3
    guard, _ = get_diffusion_loss("grpo_guard")()(StepLossInput(
        log_prob, old, adv, mean=mean, old_mean=old_mean, std=std, dt=-0.1))
    ratio_log = guard_log_ratio(log_prob, old, mean, old_mean, std)
    plain, _ = get_diffusion_loss("flow_grpo")()(StepLossInput(ratio_log, torch.zeros(4), adv))
    torch.testing.assert_close(guard, plain / 0.1)


@pytest.mark.parametrize("name", ["flow_dppo", "grpo_guard"])
def test_missing_diffusion_extras_raise(name):
    inp = StepLossInput(torch.zeros(2), torch.zeros(2), torch.ones(2), mean=torch.zeros(2, 1, 2))
    with pytest.raises(ValueError, match=f"'{name}' needs old_mean, std"):
        get_diffusion_loss(name)()(inp)


def test_grpo_guard_needs_negative_dt():
    base = dict(mean=torch.zeros(2, 1, 2), old_mean=torch.zeros(2, 1, 2), std=torch.ones(2))
    with pytest.raises(ValueError, match="needs dt"):
        get_diffusion_loss("grpo_guard")()(StepLossInput(torch.zeros(2), torch.zeros(2), torch.ones(2), **base))
    with pytest.raises(ValueError, match=r"dt has positive entries \[0.25\]"):
        inp = StepLossInput(torch.zeros(2), torch.zeros(2), torch.ones(2), dt=torch.tensor([-0.1, 0.25]), **base)
        get_diffusion_loss("grpo_guard")()(inp)


# ------------------------------------------------------------------ KL forms


def test_kl_hand_values_and_the_factor_minus_dt():
    # mean - ref = 0.1 everywhere, s = 0.5, dt = -0.25:
    # exact = 0.01 / (2 * 0.25) = 0.02; code form: std_t = 0.5 / sqrt(0.25) = 1 -> 0.01 / 2 = 0.005
    ref = torch.zeros(2, 3, 4)
    mean = torch.full((2, 3, 4), 0.1)
    std = torch.tensor([0.5, 0.0])  # sample 1 is deterministic: both forms give 0
    exact = get_diffusion_kl("exact")(mean, ref, std, -0.25)
    code = get_diffusion_kl("flow_grpo_code")(mean, ref, std, -0.25)
    torch.testing.assert_close(exact, torch.tensor([0.02, 0.0]))
    torch.testing.assert_close(code, torch.tensor([0.005, 0.0]))
    # In general code = (-dt) * exact, per sample.
    gen = torch.Generator().manual_seed(4)
    mean, ref = torch.randn(2, 3, 2, 5, 5, generator=gen)
    std, dt = torch.tensor([0.3, 0.05, 0.2]), torch.tensor([-0.1, -0.02, -0.3])
    torch.testing.assert_close(flow_grpo_code_kl(mean, ref, std, dt), -dt * exact_kl(mean, ref, std, dt))


def test_exact_kl_matches_torch_distributions():
    gen = torch.Generator().manual_seed(5)
    mean, ref = torch.randn(2, 3, 4, 6, generator=gen, dtype=torch.float64)
    std = torch.tensor([0.2, 0.7, 1.3], dtype=torch.float64)
    s = std.reshape(-1, 1, 1).expand_as(mean)
    brute = kl_divergence(Normal(mean, s), Normal(ref, s)).mean(dim=(1, 2))
    torch.testing.assert_close(exact_kl(mean, ref, std).double(), brute, atol=1e-6, rtol=1e-5)


def test_kl_gradient_flows_to_mean_only():
    mean = torch.full((1, 2), 0.3, requires_grad=True)
    ref = torch.zeros(1, 2, requires_grad=True)
    exact_kl(mean, ref, torch.tensor([0.5])).sum().backward()
    # d/dmean of mean_d (mean - ref)^2 / (2 s^2) = (mean - ref) / (s^2 D) = 0.3 / (0.25 * 2) = 0.6
    torch.testing.assert_close(mean.grad, torch.full((1, 2), 0.6))
    assert ref.grad is None


# ------------------------------------------------------------------ registries and input checks


def test_registries_list_their_names():
    assert DIFFUSION_LOSSES.names() == ["flow_dppo", "flow_grpo", "grpo_guard"]
    assert DIFFUSION_KL.names() == ["exact", "flow_grpo_code"]
    with pytest.raises(RegistryError, match="unknown diffusion loss .*flow_dppo, flow_grpo, grpo_guard"):
        get_diffusion_loss("flowgrpo")
    with pytest.raises(RegistryError, match="exact, flow_grpo_code"):
        get_diffusion_kl("k3")


def test_input_checks():
    with pytest.raises(ValueError, match="old_log_prob has shape"):
        StepLossInput(torch.zeros(3), torch.zeros(4), torch.zeros(3))
    with pytest.raises(ValueError, match="mask has shape"):
        StepLossInput(torch.zeros(3), torch.zeros(3), torch.zeros(3), mask=torch.ones(4))
    with pytest.raises(ValueError, match="clip_range=1.5"):
        get_diffusion_loss("flow_grpo")(clip_range=1.5)
    with pytest.raises(ValueError, match="adv_clip_max=0"):
        ClippedStepOptions(adv_clip_max=0).check()
    with pytest.raises(ValueError, match="empty"):
        StepLossInput(torch.zeros(0), torch.zeros(0), torch.zeros(0))

"""Tests for omni_rl.algos.forward_losses' DiffusionNFT loss: hand values and gradients, the
closed form at v_old == v, the adaptive x0 weighting, the optimality mapping."""
import pytest
import torch

from omni_rl.algos.forward_losses import FORWARD_LOSSES, ForwardLossInput, nft_optimality

nft = FORWARD_LOSSES.get("diffusion_nft")


def test_optimality_maps_the_clipped_advantage_onto_0_1():
    adv = torch.tensor([-7.0, -5.0, 0.0, 2.5, 5.0, 9.0])
    assert nft_optimality(adv, 5.0).tolist() == [0.0, 0.0, 0.5, 0.75, 1.0, 1.0]


def test_hand_values_and_gradient():
    # b = 1, v_old = 0: v+ = v, v- = -v. r = [1, 0] (A = +-adv_clip_max).
    v = torch.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)
    u = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    inp = ForwardLossInput(
        velocity=v, target=u, timesteps=torch.tensor([0.3, 0.7]), old_velocity=torch.zeros(2, 2),
        advantages=torch.tensor([5.0, -5.0]))
    loss, metrics = nft(beta=1.0)(inp)
    # sample 0 (r = 1): e+ = mean(0, 1) = 0.5; e- = mean((-1-1)^2, 1) = 2.5 -> counts 0.5
    # sample 1 (r = 0): e- = mean(0, (-2)^2) = 2; e+ = mean(0, 4) = 2   -> counts 2
    assert loss.item() == pytest.approx((0.5 + 2.0) / 2)
    assert metrics["nft_positive"].item() == pytest.approx(1.25)
    assert metrics["nft_negative"].item() == pytest.approx(2.25)
    assert metrics["nft_r_mean"].item() == pytest.approx(0.5)
    assert metrics["nft_old_gap"].item() == pytest.approx((0.5 + 2.0) / 2)
    loss.backward()
    # d/dv0 = 1/B * r * 2 b (v+ - u) / D = 0.5 * [0, -1] ; d/dv1 = 1/B * (1 - r) * (-2 b (v- - u) / D) = 0.5 * [0, 2]
    torch.testing.assert_close(v.grad, torch.tensor([[0.0, -0.5], [0.0, 1.0]]))
    for value in metrics.values():
        assert value.ndim == 0 and not value.requires_grad


@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0])
def test_at_v_old_equal_v_the_loss_is_flow_matching_and_the_gradient_follows_the_advantage(beta):
    torch.manual_seed(0)
    v = torch.randn(3, 2, 2, requires_grad=True)
    u = torch.randn(3, 2, 2)
    adv = torch.tensor([4.0, 0.0, -1.0])
    loss, _ = nft(beta=beta)(ForwardLossInput(
        velocity=v, target=u, timesteps=torch.rand(3), old_velocity=v.detach().clone(), advantages=adv))
    assert loss.item() == pytest.approx(((v - u) ** 2).flatten(1).mean(1).mean().item(), rel=1e-6)
    loss.backward()
    r = (adv / 10 + 0.5).reshape(3, 1, 1)
    # per sample 2 b (2 r - 1) (v - u) / D, averaged over B = 3; D = 4
    torch.testing.assert_close(v.grad, 2 * beta * (2 * r - 1) * (v.detach() - u) / 4 / 3)


def test_loop_matches_vectorised():
    torch.manual_seed(1)
    v, v_old, u = torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 3)
    adv = torch.tensor([1.0, -2.0, 7.0, 0.3])
    loss, _ = nft(beta=0.7)(ForwardLossInput(
        velocity=v, target=u, timesteps=torch.rand(4), old_velocity=v_old, advantages=adv))
    total = 0.0
    for i in range(4):
        r = min(max(adv[i].item() / 10 + 0.5, 0.0), 1.0)
        pos = 0.7 * v[i] + 0.3 * v_old[i]
        neg = 1.7 * v_old[i] - 0.7 * v[i]
        total += r * ((pos - u[i]) ** 2).mean().item() + (1 - r) * ((neg - u[i]) ** 2).mean().item()
    assert loss.item() == pytest.approx(total / 4, rel=1e-6)


def test_adaptive_x0_weighting_hand_values():
    # x0 = 0, eps = [2, 0], t = 0.5: x_t = [1, 0], u = [2, 0]; v = v_old = [1, 0], b = 1.
    # x0_hat = x_t - t v = [0.5, 0]: scale = mean |x0_hat - x0| = 0.25;
    # e+ = e- = mean(0.5^2, 0) / 0.25 = 0.5 (= t^2 mean (v - u)^2 / scale = 0.25 * 0.5 / 0.25).
    x0, eps, t = torch.zeros(1, 2), torch.tensor([[2.0, 0.0]]), torch.tensor([0.5])
    x_t = (1 - t[:, None]) * x0 + t[:, None] * eps
    v = torch.tensor([[1.0, 0.0]], requires_grad=True)
    common = dict(target=eps - x0, timesteps=t, noisy=x_t, clean=x0, old_velocity=v.detach().clone())
    loss, metrics = nft(beta=1.0, weighting="adaptive_x0")(ForwardLossInput(
        velocity=v, advantages=torch.tensor([5.0]), **common))
    assert loss.item() == pytest.approx(0.5)
    loss.backward()
    # r = 1: d e+ / dv = 2 (x0_hat+ - x0) (-t) b / D / scale = 2 * [0.5, 0] * (-0.5) / 2 / 0.25 (scale has no gradient)
    torch.testing.assert_close(v.grad, torch.tensor([[-1.0, 0.0]]))
    v.grad = None
    loss, _ = nft(beta=1.0, weighting="adaptive_x0")(ForwardLossInput(
        velocity=v, advantages=torch.tensor([0.0]), **common))
    loss.backward()  # r = 1/2 at v_old = v: the two halves cancel
    torch.testing.assert_close(v.grad, torch.zeros(1, 2))


def test_missing_inputs_and_bad_values_are_named():
    v = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="old_velocity"):
        nft()(ForwardLossInput(velocity=v, target=v, timesteps=torch.rand(2), advantages=torch.zeros(2)))
    with pytest.raises(ValueError, match="noisy, clean"):
        nft(weighting="adaptive_x0")(ForwardLossInput(
            velocity=v, target=v, timesteps=torch.rand(2), advantages=torch.zeros(2), old_velocity=v))
    with pytest.raises(ValueError, match="weighting='x0'"):
        nft(weighting="x0")
    with pytest.raises(ValueError, match="target has shape"):
        ForwardLossInput(velocity=v, target=torch.zeros(2, 4), timesteps=torch.rand(2))
    with pytest.raises(ValueError, match="beta=0"):
        nft(beta=0)

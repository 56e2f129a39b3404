"""Tests for omni_rl.algos.forward_losses' Diffusion-DPO loss: hand values and gradients, the
log 2 anchor at the reference, a loop over pairs, the pair layout check."""
import math

import pytest
import torch

from omni_rl.algos.forward_losses import FORWARD_LOSSES, ForwardLossInput

dpo = FORWARD_LOSSES.get("diffusion_dpo")


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_hand_values_and_gradient():
    # One pair, D = 1. u = 1 for both. Winner v = 1.5 (err 0.25), loser v = 3 (err 4); the
    # reference v = 2 for both (ref err 1). gap_w = -0.75, gap_l = 3.
    # beta = 2: z = -(2 / 2) (-0.75 - 3) = 3.75; loss = -log sigmoid(3.75) = log(1 + e^-3.75).
    v = torch.tensor([[1.5], [3.0]], requires_grad=True)
    inp = ForwardLossInput(
        velocity=v, target=torch.ones(2, 1), timesteps=torch.tensor([0.4, 0.4]), ref_velocity=torch.full((2, 1), 2.0))
    loss, metrics = dpo(beta=2.0)(inp)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-3.75)))
    loss.backward()
    # d loss / d err_w = (beta / 2) sigmoid(-z) = sigmoid(-3.75); d err_w / d v_w = 2 (1.5 - 1) = 1
    # d loss / d err_l = -sigmoid(-3.75);                          d err_l / d v_l = 2 (3 - 1) = 4
    s = sigmoid(-3.75)
    torch.testing.assert_close(v.grad, torch.tensor([[s], [-4 * s]]))
    assert metrics["dpo_accuracy"].item() == 1.0
    assert metrics["dpo_margin"].item() == pytest.approx(3.75)
    assert metrics["dpo_err_winner"].item() == pytest.approx(0.25)
    assert metrics["dpo_err_loser"].item() == pytest.approx(4.0)
    assert metrics["dpo_pairs"].item() == 1.0
    for value in metrics.values():
        assert value.ndim == 0 and not value.requires_grad


def test_at_the_reference_the_loss_is_log_2():
    torch.manual_seed(0)
    v = torch.randn(4, 2, 3, requires_grad=True)
    u = torch.randn(4, 2, 3)
    loss, metrics = dpo(beta=10.0)(ForwardLossInput(
        velocity=v, target=u, timesteps=torch.rand(4), ref_velocity=v.detach().clone()))
    assert loss.item() == pytest.approx(math.log(2))
    loss.backward()
    # sigmoid(0) = 1/2: d loss / d v_w = (beta / 2)(1/2) 2 (v_w - u) / D / P, the loser's the negative
    D, P = 6, 2
    expected = 10.0 / 2 * 0.5 * 2 * (v.detach() - u) / D / P
    expected[P:] *= -1
    torch.testing.assert_close(v.grad, expected)
    assert metrics["dpo_accuracy"].item() == 0.0  # equal gaps are not a win


def test_loop_matches_vectorised():
    torch.manual_seed(2)
    v, v_ref, u = torch.randn(6, 5), torch.randn(6, 5), torch.randn(6, 5)
    loss, metrics = dpo(beta=3.0)(ForwardLossInput(velocity=v, target=u, timesteps=torch.rand(6), ref_velocity=v_ref))
    total, wins = 0.0, 0
    for i in range(3):
        w, l = i, i + 3
        gw = ((v[w] - u[w]) ** 2).mean() - ((v_ref[w] - u[w]) ** 2).mean()
        gl = ((v[l] - u[l]) ** 2).mean() - ((v_ref[l] - u[l]) ** 2).mean()
        total += -math.log(sigmoid(-1.5 * (gw - gl).item()))
        wins += int(gw < gl)
    assert loss.item() == pytest.approx(total / 3, rel=1e-6)
    assert metrics["dpo_accuracy"].item() == pytest.approx(wins / 3)


def test_pairs_and_missing_reference_are_refused():
    v = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="even count"):
        dpo()(ForwardLossInput(velocity=v, target=v, timesteps=torch.rand(3), ref_velocity=v))
    with pytest.raises(ValueError, match="ref_velocity"):
        dpo()(ForwardLossInput(velocity=torch.zeros(2, 2), target=torch.zeros(2, 2), timesteps=torch.rand(2)))
    with pytest.raises(ValueError, match="beta=-1"):
        dpo(beta=-1)

"""Tests for omni_rl.families.forward_draws: draws fixed by (seed, chunk) alone, in range, and the
noising x_t = (1 - t) x0 + t eps with target eps - x0."""
import pytest
import torch

from omni_rl.algos.latent_streams import LatentStreams
from omni_rl.families.forward_draws import T_EPS, TIMESTEP_SAMPLINGS, forward_draws, noised


@pytest.mark.parametrize("sampling", TIMESTEP_SAMPLINGS)
def test_a_sample_draws_the_same_alone_or_with_others_and_differs_by_chunk(sampling):
    clean = torch.zeros(3, 2, 4, 4)
    seeds = torch.tensor([7, 8, 9])
    t, eps = forward_draws(seeds, 0, clean, sampling)
    t1, eps1 = forward_draws(seeds[1:2], 0, clean[1:2], sampling)
    assert t[1] == t1[0] and torch.equal(eps[1], eps1[0])
    t_next, eps_next = forward_draws(seeds, 1, clean, sampling)
    assert not torch.equal(t, t_next) and not torch.equal(eps, eps_next)
    assert bool(((t >= T_EPS) & (t <= 1 - T_EPS)).all()) and eps.shape == clean.shape


def test_uniform_draws_spread_over_the_interval():
    t, _ = forward_draws(torch.arange(400), 0, torch.zeros(400, 1), "uniform")
    assert 0.45 < t.mean().item() < 0.55 and t.min().item() < 0.05 and t.max().item() > 0.95


def test_noised_by_hand():
    clean = torch.tensor([[2.0, -2.0]])
    noise = torch.tensor([[1.0, 1.0]])
    x_t, target = noised(clean, noise, torch.tensor([0.25]))
    torch.testing.assert_close(x_t, torch.tensor([[0.75 * 2 + 0.25, -0.75 * 2 + 0.25]]))
    torch.testing.assert_close(target, torch.tensor([[-1.0, 3.0]]))


def test_streams_are_noised_as_one_flat_latent():
    clean = LatentStreams({"video": torch.ones(2, 3), "audio": torch.zeros(2, 2)})
    t, eps = forward_draws(torch.tensor([1, 2]), 0, clean, "logit_normal")
    x_t, target = noised(clean, eps, t)
    assert isinstance(x_t, LatentStreams) and x_t["video"].shape == (2, 3) and target.shape == (2, 5)
    torch.testing.assert_close(x_t["audio"], t[:, None] * eps["audio"])


def test_an_unknown_sampling_is_named():
    with pytest.raises(ValueError, match="'beta'"):
        forward_draws(torch.tensor([1]), 0, torch.zeros(1, 2), "beta")

"""Tests for omni_rl.algos.flow_sde: hand-computed steps, diffusers parity, sample/score agreement,
per-sample sigmas and generators, latent ranks, deterministic steps, dtypes."""
import pytest
import torch
from torch.distributions import Normal

from omni_rl.algos.flow_sde import (
    STEP_KERNELS,
    StepOutput,
    cps_step,
    dance_sde_step,
    get_step_kernel,
    ode_step,
    sde_step,
)
from omni_rl.registry import RegistryError

KERNELS = ["sde", "cps", "dance_sde", "ode"]
STOCHASTIC = ["sde", "cps", "dance_sde"]

# One latent of shape [1, 1, 1, 2] (image-like) used by the hand-computed cases.
X = torch.tensor([1.0, 2.0]).reshape(1, 1, 1, 2)
V = torch.tensor([1.0, -2.0]).reshape(1, 1, 1, 2)


def _latents(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def _call(name, x, v, sigma, sigma_next, noise_level, **kw):
    return get_step_kernel(name)(
        model_output=v, sigma=sigma, sigma_next=sigma_next, sample=x, noise_level=noise_level, **kw
    )


# ------------------------------------------------------------------ hand-computed values


def test_sde_hand_values():
    # sigma 0.5 -> 0.25, a = 0.5: std_t = 0.5 * sqrt(0.5 / 0.5) = 0.5, dt = -0.25,
    # s = 0.5 * sqrt(0.25) = 0.25.
    # mean = x (1 + 0.25 / 1 * -0.25) + v (1 + 0.25 * 0.5 / 1) * -0.25 = 0.9375 x - 0.28125 v
    #      = [0.9375 - 0.28125, 1.875 + 0.5625] = [0.65625, 2.4375]
    # prev = mean + 0.25 * [1, -1]: z^2 = 1 everywhere, so
    # log_prob = -0.5 - log 0.25 - log sqrt(2 pi) = -0.5 + 1.3862944 - 0.9189385 = -0.0326441
    prev = torch.tensor([0.90625, 2.1875]).reshape(1, 1, 1, 2)
    out = sde_step(model_output=V, sigma=0.5, sigma_next=0.25, sample=X, noise_level=0.5, prev_sample=prev)
    assert isinstance(out, StepOutput)
    torch.testing.assert_close(out.mean.flatten(), torch.tensor([0.65625, 2.4375]))
    torch.testing.assert_close(out.std, torch.tensor([0.25]))
    torch.testing.assert_close(out.log_prob, torch.tensor([-0.0326441]), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.prev_sample, prev)


def test_sde_at_sigma_one_uses_sigma_next_in_denominator():
    # sigma 1 -> 0.75, a = 0.5: 1 - sigma = 0, so std_t = 0.5 * sqrt(1 / (1 - 0.75)) = 1,
    # s = 1 * sqrt(0.25) = 0.5; mean = x (1 + 1/2 * -0.25) + v (1 + 0) * -0.25 = 0.875 x - 0.25 v
    #      = [0.875 - 0.25, 1.75 + 0.5] = [0.625, 2.25]
    out = sde_step(model_output=V, sigma=1.0, sigma_next=0.75, sample=X, noise_level=0.5)
    torch.testing.assert_close(out.mean.flatten(), torch.tensor([0.625, 2.25]))
    torch.testing.assert_close(out.std, torch.tensor([0.5]))
    assert torch.isfinite(out.log_prob).all() and torch.isfinite(out.prev_sample).all()


def test_cps_hand_values():
    # sigma 0.5 -> 0.25, a = 1/3: s = 0.25 * sin(pi / 6) = 0.125.
    # x0_hat = x - 0.5 v = [0.5, 3], x1_hat = x + 0.5 v = [1.5, 1],
    # sqrt(0.25^2 - 0.125^2) = sqrt(0.046875) = 0.21650635,
    # mean = 0.75 x0_hat + 0.21650635 x1_hat = [0.375 + 0.32475953, 2.25 + 0.21650635]
    # prev = mean + 0.125 * [2, 0]: mean z^2 = (4 + 0) / 2 = 2, so
    # log_prob = -2 / 2 - log 0.125 - log sqrt(2 pi) = -1 + 2.0794415 - 0.9189385 = 0.1605030
    out = cps_step(model_output=V, sigma=0.5, sigma_next=0.25, sample=X, noise_level=1 / 3)
    expected_mean = torch.tensor([0.69975953, 2.46650635])
    torch.testing.assert_close(out.mean.flatten(), expected_mean)
    torch.testing.assert_close(out.std, torch.tensor([0.125]))
    prev = (expected_mean + torch.tensor([0.25, 0.0])).reshape(1, 1, 1, 2)
    scored = cps_step(
        model_output=V, sigma=0.5, sigma_next=0.25, sample=X, noise_level=1 / 3, prev_sample=prev
    )
    torch.testing.assert_close(scored.log_prob, torch.tensor([0.1605030]), atol=1e-5, rtol=0)


def test_cps_full_noise_and_last_step():
    # a = 1: s = sigma_next = 0.25 and the x1_hat coefficient sqrt(0.0625 - 0.0625) is 0,
    # mean = 0.75 x0_hat = [0.375, 2.25].
    out = cps_step(model_output=V, sigma=0.5, sigma_next=0.25, sample=X, noise_level=1.0)
    torch.testing.assert_close(out.mean.flatten(), torch.tensor([0.375, 2.25]))
    torch.testing.assert_close(out.std, torch.tensor([0.25]))
    # sigma_next = 0: s = 0, the step lands on x0_hat = [0.5, 3] deterministically.
    last = cps_step(model_output=V, sigma=0.5, sigma_next=0.0, sample=X, noise_level=0.7)
    torch.testing.assert_close(last.prev_sample.flatten(), torch.tensor([0.5, 3.0]))
    assert last.std.item() == 0 and last.log_prob.item() == 0


def test_dance_sde_hand_values():
    # sigma 0.5 -> 0.25, eta = 0.5: x0_hat = [0.5, 3],
    # score = -(x - 0.5 x0_hat) / 0.25 = -([1, 2] - [0.25, 1.5]) / 0.25 = [-3, -2],
    # mean = x + v dt - 0.5 eta^2 score dt = [0.75, 2.5] - 0.125 * [-3, -2] * -0.25
    #      = [0.75 - 0.09375, 2.5 - 0.0625] = [0.65625, 2.4375]; s = 0.5 * sqrt(0.25) = 0.25.
    out = dance_sde_step(model_output=V, sigma=0.5, sigma_next=0.25, sample=X, noise_level=0.5)
    torch.testing.assert_close(out.mean.flatten(), torch.tensor([0.65625, 2.4375]))
    torch.testing.assert_close(out.std, torch.tensor([0.25]))


def test_dance_sde_equals_sde_with_matched_noise_level():
    # DanceGRPO's eta is Flow-GRPO's std_t: a = eta * sqrt((1 - sigma) / sigma) gives the same step.
    x, v = _latents((3, 2, 4, 4))
    sigma, sigma_next, eta = torch.tensor([0.9, 0.6, 0.3]), torch.tensor([0.8, 0.4, 0.1]), 0.3
    a = eta * torch.sqrt((1 - sigma) / sigma)
    prev = x + 0.1 * v
    common = dict(model_output=v, sigma=sigma, sigma_next=sigma_next, sample=x, prev_sample=prev)
    dance = dance_sde_step(noise_level=eta, **common)
    sde = sde_step(noise_level=a, **common)
    torch.testing.assert_close(dance.mean, sde.mean)
    torch.testing.assert_close(dance.std, sde.std)
    torch.testing.assert_close(dance.log_prob, sde.log_prob)


def test_ode_hand_values():
    # prev = x + (0.25 - 0.5) v = [1 - 0.25, 2 + 0.5] = [0.75, 2.5]; std 0, log_prob 0.
    out = ode_step(model_output=V, sigma=0.5, sigma_next=0.25, sample=X, noise_level=0.0)
    torch.testing.assert_close(out.prev_sample.flatten(), torch.tensor([0.75, 2.5]))
    assert out.std.tolist() == [0.0] and out.log_prob.tolist() == [0.0]


# ------------------------------------------------------------------ parity and consistency


def test_ode_matches_diffusers_euler_scheduler():
    diffusers = pytest.importorskip("diffusers")
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(8)
    x, _ = _latents((2, 4, 8, 8))
    for i, t in enumerate(scheduler.timesteps):
        _, v = _latents((2, 4, 8, 8), seed=i + 1)
        expected = scheduler.step(v, t, x).prev_sample
        sigma, sigma_next = scheduler.sigmas[i], scheduler.sigmas[i + 1]
        ours = ode_step(model_output=v, sigma=sigma, sigma_next=sigma_next, sample=x, noise_level=0.0)
        assert torch.equal(ours.prev_sample, expected), f"step {i}"
        x = expected


def test_sde_with_zero_noise_is_the_euler_step():
    x, v = _latents((2, 3, 4, 4))
    sde = sde_step(model_output=v, sigma=0.7, sigma_next=0.5, sample=x, noise_level=0.0)
    ode = ode_step(model_output=v, sigma=0.7, sigma_next=0.5, sample=x, noise_level=0.0)
    torch.testing.assert_close(sde.prev_sample, ode.prev_sample)


@pytest.mark.parametrize("name", KERNELS)
def test_sample_then_score_gives_the_same_log_prob(name):
    x, v = _latents((3, 4, 6, 6))
    sampled = _call(name, x, v, 0.8, 0.6, 0.7, generator=torch.Generator().manual_seed(3))
    scored = _call(name, x, v, 0.8, 0.6, 0.7, prev_sample=sampled.prev_sample)
    assert torch.equal(sampled.log_prob, scored.log_prob)
    assert torch.equal(sampled.mean, scored.mean)
    assert torch.equal(scored.prev_sample, sampled.prev_sample)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_sampling_uses_the_generators_standard_normal(name):
    # prev = mean + s * eps with eps exactly the generator's randn stream.
    x, v = _latents((2, 3, 4, 4))
    out = _call(name, x, v, 0.8, 0.6, 0.7, generator=torch.Generator().manual_seed(11))
    eps = torch.randn(x.shape, generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(out.prev_sample, out.mean + out.std.reshape(-1, 1, 1, 1) * eps)


@pytest.mark.parametrize("name", KERNELS)
def test_per_sample_sigmas_equal_running_each_sample_alone(name):
    x, v = _latents((3, 2, 5, 5))
    sigma = torch.tensor([1.0, 0.5, 0.2])
    sigma_next = torch.tensor([0.8, 0.3, 0.0])
    level = torch.tensor([0.7, 0.0, 0.5])  # sample 1 sits outside its SDE window
    prev = x - 0.2 * v
    batched = _call(name, x, v, sigma, sigma_next, level, prev_sample=prev)
    for i in range(3):
        one = slice(i, i + 1)
        alone = _call(name, x[one], v[one], float(sigma[i]), sigma_next[i], float(level[i]), prev_sample=prev[one])
        for field in StepOutput._fields:
            torch.testing.assert_close(getattr(batched, field)[one], getattr(alone, field), msg=f"{field} {i}")


@pytest.mark.parametrize("name", STOCHASTIC)
def test_list_of_generators_equals_each_sample_alone(name):
    x, v = _latents((3, 2, 4, 4))
    def gens(*seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]

    batched = _call(name, x, v, 0.9, 0.7, 0.7, generator=gens(100, 101, 102))
    for i in range(3):
        alone = _call(name, x[i : i + 1], v[i : i + 1], 0.9, 0.7, 0.7, generator=gens(100 + i))
        torch.testing.assert_close(batched.prev_sample[i : i + 1], alone.prev_sample)
    # Sample 0's noise does not depend on its neighbours.
    other = _call(name, x, v, 0.9, 0.7, 0.7, generator=gens(100, 7, 8))
    torch.testing.assert_close(other.prev_sample[0], batched.prev_sample[0])
    assert not torch.allclose(other.prev_sample[1], batched.prev_sample[1])


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize(
    "shape", [(2, 4, 8, 8), (2, 4, 3, 8, 8), (2, 4, 16)], ids=["image", "video", "audio"]
)
def test_latent_ranks(name, shape):
    x, v = _latents(shape)
    out = _call(name, x, v, 0.6, 0.4, 0.7)
    assert out.prev_sample.shape == shape and out.mean.shape == shape
    assert out.log_prob.shape == (2,) and out.std.shape == (2,)
    assert torch.isfinite(out.log_prob).all()


@pytest.mark.parametrize("name", KERNELS)
def test_zero_noise_is_deterministic_with_log_prob_zero(name):
    x, v = _latents((2, 3, 4, 4))
    v.requires_grad_(True)
    out = _call(name, x, v, 0.6, 0.4, 0.0)
    assert torch.equal(out.prev_sample, out.mean)
    assert out.std.tolist() == [0.0, 0.0] and out.log_prob.tolist() == [0.0, 0.0]
    # Scoring any given latent at a deterministic step is still 0, and gradients stay finite.
    scored = _call(name, x, v, 0.6, 0.4, 0.0, prev_sample=x + 1)
    assert scored.log_prob.tolist() == [0.0, 0.0]
    (scored.log_prob.sum() + scored.mean.sum()).backward()
    assert torch.isfinite(v.grad).all()


@pytest.mark.parametrize("name", STOCHASTIC)
def test_log_prob_matches_brute_force_normal(name):
    x, v = _latents((3, 2, 4, 5))
    sigma = torch.tensor([0.95, 0.5, 0.3])
    level = torch.tensor([0.7, 0.4, 1.0])
    out = _call(name, x, v, sigma, sigma - 0.1, level, generator=torch.Generator().manual_seed(5))
    mean, std, prev = out.mean.double(), out.std.double(), out.prev_sample.double()
    # The log-prob is the per-dimension mean of the elementwise Normal log-density.
    brute = Normal(mean, std.reshape(-1, 1, 1, 1).expand_as(mean)).log_prob(prev).mean(dim=(1, 2, 3))
    torch.testing.assert_close(out.log_prob.double(), brute, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_log_prob_gradient_flows_through_the_mean_only(name):
    x, v = _latents((2, 2, 3, 3))
    v.requires_grad_(True)
    out = _call(name, x, v, 0.7, 0.5, 0.7)
    assert out.prev_sample.requires_grad  # the returned sample keeps its graph
    out.log_prob.sum().backward()
    # prev = mean + s eps held fixed: d log_prob / d mean = (prev - mean) / (s^2 D) = eps / (s D), not 0.
    assert torch.isfinite(v.grad).all() and v.grad.abs().sum() > 0


@pytest.mark.parametrize("name", KERNELS)
def test_half_precision_inputs_give_fp32_outputs(name):
    x, v = _latents((2, 3, 4, 4))
    out = _call(name, x.half(), v.half(), torch.tensor(0.6, dtype=torch.float16), 0.4, 0.7)
    for field in StepOutput._fields:
        assert getattr(out, field).dtype == torch.float32, field
    sigma = float(torch.tensor(0.6, dtype=torch.float16))
    ref = _call(name, x.half().float(), v.half().float(), sigma, 0.4, 0.7, prev_sample=out.prev_sample)
    torch.testing.assert_close(ref.log_prob, out.log_prob)


# ------------------------------------------------------------------ registry and errors


def test_registry_names_and_lookup():
    assert STEP_KERNELS.names() == ["cps", "dance_sde", "ode", "sde"]
    assert get_step_kernel("sde") is sde_step and get_step_kernel("ode") is ode_step
    with pytest.raises(RegistryError, match="cps, dance_sde, ode, sde"):
        get_step_kernel("sdee")


@pytest.mark.parametrize("name", STOCHASTIC)
def test_bad_sigmas_raise(name):
    x, v = _latents((2, 2, 2, 2))
    with pytest.raises(ValueError, match=r"sample 1 has sigma=0.5, sigma_next=0.5"):
        _call(name, x, v, torch.tensor([0.9, 0.5]), torch.tensor([0.8, 0.5]), 0.7)
    with pytest.raises(ValueError, match="0 <= sigma_next < sigma <= 1"):
        _call(name, x, v, 1.5, 0.5, 0.7)
    with pytest.raises(ValueError, match="noise_level=-0.1"):
        _call(name, x, v, 0.9, 0.5, -0.1)


def test_bad_shapes_and_generators_raise():
    x, v = _latents((2, 2, 2, 2))
    with pytest.raises(ValueError, match=r"sigma has shape \(3,\)"):
        sde_step(model_output=v, sigma=torch.ones(3) * 0.5, sigma_next=0.2, sample=x, noise_level=0.7)
    with pytest.raises(ValueError, match="model_output has shape"):
        sde_step(model_output=v[:1], sigma=0.5, sigma_next=0.2, sample=x, noise_level=0.7)
    with pytest.raises(ValueError, match="prev_sample has shape"):
        sde_step(model_output=v, sigma=0.5, sigma_next=0.2, sample=x, noise_level=0.7, prev_sample=x[0])
    with pytest.raises(ValueError, match="got 1 generators for a batch of 2"):
        sde_step(
            model_output=v, sigma=0.5, sigma_next=0.2, sample=x, noise_level=0.7, generator=[torch.Generator()]
        )
    with pytest.raises(ValueError, match="at least one non-batch dim"):
        sde_step(model_output=v.flatten(), sigma=0.5, sigma_next=0.2, sample=x.flatten(), noise_level=0.7)

"""`omni_rl/utils/latent_streams.py` and `flow_sde.step_latents`: several latent streams as one action."""
import math

import pytest
import torch

from omni_rl.algos.flow_sde import get_step_kernel, step_latents
from omni_rl.algos import latent_streams as ls
from omni_rl.algos.latent_streams import LatentStreams


def streams(batch: int, seed: int = 0) -> LatentStreams:
    g = torch.Generator().manual_seed(seed)
    return LatentStreams({"video": torch.randn(batch, 3, 2, 4, generator=g), "audio": torch.randn(batch, 2, 5, generator=g)})


def test_flat_concatenates_the_streams_per_sample_and_unflat_inverts_it():
    x = streams(3)
    flat = ls.flat(x)
    assert flat.shape == (3, 24 + 10)
    assert torch.equal(flat[1, :24], x["video"][1].flatten()) and torch.equal(flat[1, 24:], x["audio"][1].flatten())
    back = ls.unflat(flat, x)
    assert back.names == ("video", "audio") and all(torch.equal(back[k], x[k]) for k in x.names)
    with pytest.raises(ValueError, match="33 values per sample, the streams hold 34"):
        ls.unflat(flat[:, :33], x)


def test_a_plain_tensor_passes_through_every_helper():
    t = torch.randn(4, 3, 2)
    assert torch.equal(ls.stack([t[0], t[1]]), t[:2])
    assert torch.equal(ls.index(t, 1, dim=1), t[:, 1])
    assert torch.equal(ls.select(t, torch.tensor([2, 0])), t[[2, 0]])
    assert ls.shape_of(t) == (4, 3, 2)


def test_stack_index_take_and_select_work_stream_by_stream():
    a, b = streams(2, 1), streams(2, 2)
    traj = ls.stack([a, b], dim=1)  # [B, S, ...]
    assert ls.shape_of(traj) == {"video": (2, 2, 3, 2, 4), "audio": (2, 2, 2, 5)}
    assert torch.equal(ls.index(traj, 1, dim=1)["audio"], b["audio"])
    picked = ls.take(traj, torch.tensor([0, 1]), torch.tensor([1, 0]))
    assert torch.equal(picked["video"][0], b["video"][0]) and torch.equal(picked["video"][1], a["video"][1])
    assert torch.equal(ls.select(a, torch.tensor([1]))["video"], a["video"][1:])


def test_randn_draws_the_streams_in_order_from_one_generator():
    shape = {"video": (3, 4), "audio": (5,)}
    x = ls.randn(shape, torch.Generator().manual_seed(9))
    g = torch.Generator().manual_seed(9)
    video, audio = torch.randn(3, 4, generator=g), torch.randn(5, generator=g)
    assert torch.equal(x["video"], video) and torch.equal(x["audio"], audio)
    swapped = ls.randn({"audio": (5,), "video": (3, 4)}, torch.Generator().manual_seed(9))
    assert not torch.equal(swapped["audio"], audio)  # the order is part of the sample
    assert ls.numel_per_sample(shape) == 17


@pytest.mark.parametrize("kernel", ["sde", "cps", "dance_sde"])
def test_a_step_over_streams_is_the_step_over_their_concatenation(kernel):
    x, v = streams(2, 3), streams(2, 4)
    fn = get_step_kernel(kernel)
    common = dict(sigma=torch.tensor([0.8, 0.5]), sigma_next=torch.tensor([0.6, 0.3]), noise_level=0.7)
    sampled = step_latents(fn, model_output=v, sample=x, generator=[torch.Generator().manual_seed(s) for s in (1, 2)], **common)
    flat = fn(model_output=ls.flat(v), sample=ls.flat(x), generator=[torch.Generator().manual_seed(s) for s in (1, 2)], **common)
    assert torch.equal(ls.flat(sampled.prev_sample), flat.prev_sample)
    assert torch.equal(sampled.log_prob, flat.log_prob) and torch.equal(ls.flat(sampled.mean), flat.mean)
    # Scoring the sampled streams gives the sampler's log-prob (rollout == trainer).
    scored = step_latents(fn, model_output=v, sample=x, prev_sample=sampled.prev_sample, **common)
    torch.testing.assert_close(scored.log_prob, sampled.log_prob, atol=1e-6, rtol=0)


def test_the_joint_log_prob_is_the_per_dimension_mean_over_all_streams():
    # Worked by hand: the prev sample sits at the mean plus one std in every video dimension
    # (24 of them: each -1/2 - log s - log sqrt(2 pi)) and at the mean in every audio dimension
    # (10 of them: - log s - log sqrt(2 pi)).
    x, v = streams(1, 5), streams(1, 6)
    fn = get_step_kernel("sde")
    common = dict(sigma=torch.tensor([0.8]), sigma_next=torch.tensor([0.6]), noise_level=0.7)
    out = step_latents(fn, model_output=v, sample=x, generator=[torch.Generator().manual_seed(0)], **common)
    s = float(out.std[0])
    prev = LatentStreams({"video": out.mean["video"] + s, "audio": out.mean["audio"].clone()})
    scored = step_latents(fn, model_output=v, sample=x, prev_sample=prev, **common)
    const = -math.log(s) - 0.5 * math.log(2 * math.pi)
    expected = (24 * (const - 0.5) + 10 * const) / 34
    assert scored.log_prob.item() == pytest.approx(expected, abs=1e-5)

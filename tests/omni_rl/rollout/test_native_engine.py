"""The native rollout engine: it samples what diffusers samples, and a sample's result is its own.

What is checked, on the tiny SD3 (32x32 px, 6 steps, a few ms per forward):
- kernel `ode` + noise 0 reproduces `StableDiffusion3Pipeline.__call__` (latents and pixels);
- a sample gives the same latents / log-probs / image alone, packed with 7 others, packed with
  other companions, and when it joins mid-flight (samples at different steps in one forward);
- SDE windows come from the seed and the recorded window is a real, contiguous trajectory that
  a plain single-sample reference loop reproduces;
- explicit initial noise, bad requests, engine failures and timeouts (never a hang);
- batch keys are never mixed in a forward; weight sync changes what the engine samples.
"""
from __future__ import annotations

import contextlib
import re
import threading
import time

import numpy as np
import pytest
import torch

from omni_rl.algos.flow_sde import get_step_kernel, sde_step
from omni_rl.rollout.base import RolloutEngineError
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.sde_window import choose_sde_window
from omni_rl.rollout.types import DiffusionRequest

H = W = 32
STEPS = 6
GUIDANCE = 4.5
ATOL = 1e-5
TIMEOUT_S = 60.0  # generous: CI machines are shared; a hang fails in a minute, not never


# --- helpers -----------------------------------------------------------------------------
def request(prompt="a red cube", seed=0, **overrides) -> DiffusionRequest:
    fields = dict(
        prompt=prompt, seed=seed, height=H, width=W, num_steps=STEPS, guidance_scale=GUIDANCE,
        kernel="sde", noise_level=0.7, sde_window_size=2, sde_window_range=(0, 4),
    )
    fields.update(overrides)
    return DiffusionRequest(**fields)


@contextlib.contextmanager
def engine_for(model, **kwargs):
    engine = NativeDiffusionEngine(model, **kwargs)
    try:
        yield engine
    finally:
        engine.close()


def run_alone(model, req: DiffusionRequest):
    with engine_for(model, max_num_seqs=1) as engine:
        (result,) = engine.generate([req], timeout_s=TIMEOUT_S)
        assert engine.stats["forwards"] == req.num_steps
        assert engine.stats["forward_batch_sum"] == req.num_steps
    return result


def assert_same_result(a, b, atol=ATOL):
    assert a.window == b.window
    torch.testing.assert_close(a.latents, b.latents, atol=atol, rtol=0)
    torch.testing.assert_close(a.log_probs, b.log_probs, atol=atol, rtol=0)
    torch.testing.assert_close(a.final_latent, b.final_latent, atol=atol, rtol=0)
    torch.testing.assert_close(a.noise_levels, b.noise_levels, atol=0, rtol=0)
    assert (a.image is None) == (b.image is None)
    if a.image is not None:
        # The VAE decode is batched too, so a pixel ~1e-7 from a rounding boundary can land on
        # the next uint8 level (seen: a few values in 10^4-10^5): allow one level, on at most
        # 0.1% of the values.
        assert a.image.dtype == b.image.dtype == torch.uint8
        diff = (a.image.int() - b.image.int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3, (diff.max(), (diff > 0).sum())


class SpyModel:
    """Delegates to an adapter and records every transformer forward (batch size, sigmas,
    guidance); `hook(call_index)` runs before each forward (to block or fail on purpose)."""

    def __init__(self, inner, hook=None):
        self._inner = inner
        self._hook = hook
        self.forwards: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        self.forwards.append(
            {"batch": latents.shape[0], "sigma": sigma.detach().clone(), "guidance": guidance_scale,
             "shape": tuple(latents.shape[1:])}
        )
        if self._hook is not None:
            self._hook(len(self.forwards) - 1)
        return self._inner.predict_velocity(latents, sigma, conditioning, guidance_scale)


@torch.no_grad()
def reference_trajectory(model, req: DiffusionRequest):
    """A plain single-sample loop written from the request contract, sharing nothing with the
    engine but the adapter and the step kernel: initial noise, then one kernel call per step,
    the SDE (noise_level) inside the window and noise 0 outside it, all from one generator."""
    generator = torch.Generator().manual_seed(req.seed)
    shape = model.latent_shape(req.height, req.width)
    x = torch.randn(shape, generator=generator) if req.initial_noise is None else req.initial_noise.float()
    x = x[None]
    sigmas = model.sigmas(req.num_steps)
    cond = model.encode_prompts([req.prompt], negative_prompt=req.negative_prompt)
    start, stop = choose_sde_window(req.seed, req.num_steps, req.sde_window_size, req.sde_window_range)
    kernel = get_step_kernel(req.kernel)
    states, log_probs = [x[0]], []
    for k in range(req.num_steps):
        v = model.predict_velocity(x, sigmas[k : k + 1], cond, req.guidance_scale)
        level = req.noise_level if start <= k < stop else 0.0
        out = kernel(model_output=v, sigma=sigmas[k], sigma_next=sigmas[k + 1], sample=x,
                     noise_level=level, generator=[generator])
        x = out.prev_sample
        states.append(x[0])
        log_probs.append(out.log_prob[0])
    return (start, stop), torch.stack(states), torch.stack(log_probs)


# --- 1. the ODE sampler is diffusers' sampler --------------------------------------------
@pytest.mark.parametrize("guidance", [GUIDANCE, 1.0])  # with and without CFG
def test_ode_matches_diffusers_pipeline(tiny_sd3, guidance):
    model = tiny_sd3
    noise = torch.randn(model.latent_shape(H, W), generator=torch.Generator().manual_seed(7))
    req = request("a photo of a corgi", seed=3, kernel="ode", noise_level=0.0, sde_window_size=0,
                  sde_window_range=None, guidance_scale=guidance, initial_noise=noise)
    with engine_for(model, max_num_seqs=4) as engine:
        (ours,) = engine.generate([req], timeout_s=TIMEOUT_S)

    kwargs = dict(prompt=req.prompt, latents=noise[None].clone(), num_inference_steps=STEPS,
                  guidance_scale=guidance, height=H, width=W)
    ref_latent = model.pipeline(**kwargs, output_type="latent").images
    ref_np = model.pipeline(**kwargs, output_type="np").images

    assert ours.window == (0, STEPS) and ours.latents.shape == (STEPS + 1, *noise.shape)
    torch.testing.assert_close(ours.latents[0], noise, atol=0, rtol=0)
    torch.testing.assert_close(ours.final_latent, ref_latent[0].float(), atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.latents[-1], ours.final_latent, atol=0, rtol=0)
    assert torch.count_nonzero(ours.log_probs) == 0  # deterministic steps have log-prob 0
    # Something actually happened (not a trivially equal zero image or untouched noise).
    assert (ours.final_latent - noise).abs().max() > 0.1
    ref_uint8 = np.round(ref_np[0] * 255).astype(np.int16)
    assert ours.image.shape == (H, W, 3) and ours.image.dtype == torch.uint8
    assert np.abs(ours.image.numpy().astype(np.int16) - ref_uint8).max() <= 1
    assert ref_uint8.std() > 1  # the decoded image is not flat


# --- 2. a sample's result does not depend on its batch-mates ------------------------------
def test_result_independent_of_batch_mates(tiny_sd3):
    target = dict(prompt="a red cube", seed=123)
    alone = run_alone(tiny_sd3, request(**target))

    # Packed with 7 others of the same prompt (target first) ...
    same_prompt = [request(**target)] + [request(target["prompt"], seed=s) for s in range(1, 8)]
    # ... and with other prompts and seeds (target last, so it sits elsewhere in the batch).
    others = [request(f"companion {i} with a longer prompt", seed=1000 + i) for i in range(7)]
    others.append(request(**target))

    for batch, index in ((same_prompt, 0), (others, 7)):
        with engine_for(tiny_sd3, max_num_seqs=8) as engine:
            results = engine.generate(batch, timeout_s=TIMEOUT_S)
            # Every forward packed all 8 samples: the test really compares packed with alone.
            assert engine.stats["forwards"] == STEPS
            assert engine.stats["forward_batch_sum"] == 8 * STEPS
        assert_same_result(results[index], alone)
    # Companions differ from the target (distinct seeds and prompts give distinct samples).
    assert not torch.allclose(results[0].final_latent, alone.final_latent, atol=1e-3)


# --- 3. requests that arrive mid-flight join the running batch ---------------------------
def test_requests_join_mid_flight(tiny_sd3):
    first = [request("first wave", seed=s) for s in (11, 12, 13)]
    second = [request("second wave", seed=s) for s in (21, 22, 23)]
    alone = [run_alone(tiny_sd3, r) for r in first + second]

    started, go = threading.Event(), threading.Event()

    def hook(i):
        if i == 0:  # hold the first forward until the second wave is queued
            started.set()
            assert go.wait(TIMEOUT_S)

    spy = SpyModel(tiny_sd3, hook)
    with engine_for(spy, max_num_seqs=8) as engine:
        first_futures = engine.submit_many(first)
        assert started.wait(TIMEOUT_S)
        second_futures = []
        submitter = threading.Thread(target=lambda: second_futures.extend(engine.submit_many(second)))
        submitter.start()
        submitter.join(TIMEOUT_S)
        go.set()
        results = [f.result(timeout=TIMEOUT_S) for f in first_futures + second_futures]
        stats = dict(engine.stats)

    for got, ref in zip(results, alone):
        assert_same_result(got, ref)
    assert stats["samples"] == 6
    assert stats["forward_batch_sum"] > stats["forwards"]  # some forwards had batch > 1
    # The second wave joined while the first was mid-trajectory: one forward held both waves,
    # at different sigmas; the engine did not wait for the first wave to drain.
    assert spy.forwards[0]["batch"] == 3
    mixed = [f for f in spy.forwards if f["batch"] == 6 and f["sigma"].unique().numel() == 2]
    assert mixed, [(f["batch"], f["sigma"].tolist()) for f in spy.forwards]
    assert stats["forwards"] < 2 * STEPS


# --- 4. per-request SDE windows ----------------------------------------------------------
def test_windows_come_from_the_seed_and_are_real_trajectories(tiny_sd3):
    seeds = [0, 1, 2, 3, 4, 5, 6, 7]
    reqs = [request("windows", seed=s) for s in seeds]
    with engine_for(tiny_sd3, max_num_seqs=8) as engine:
        results = engine.generate(reqs, timeout_s=TIMEOUT_S)
    windows = {r.window for r in results}
    assert len(windows) > 1, "seeds should spread the windows over the range (test is vacuous)"

    sigmas = tiny_sd3.sigmas(STEPS)
    for req, res in zip(reqs, results):
        start, stop = choose_sde_window(req.seed, STEPS, 2, (0, 4))
        assert res.window == (start, stop) and stop - start == 2 and 0 <= start <= 2
        assert res.latents.shape == (3, *tiny_sd3.latent_shape(H, W))
        assert res.log_probs.shape == (2,) and res.noise_levels.shape == (2,)
        torch.testing.assert_close(res.sigmas, sigmas[start:stop], atol=0, rtol=0)
        torch.testing.assert_close(res.sigmas_next, sigmas[start + 1 : stop + 1], atol=0, rtol=0)
        torch.testing.assert_close(res.noise_levels, torch.full((2,), 0.7), atol=0, rtol=0)

        # The whole trajectory equals a plain single-sample loop's.
        window, states, log_probs = reference_trajectory(tiny_sd3, req)
        assert window == res.window
        torch.testing.assert_close(res.latents, states[start : stop + 1], atol=ATOL, rtol=0)
        torch.testing.assert_close(res.log_probs, log_probs[start:stop], atol=ATOL, rtol=0)
        torch.testing.assert_close(res.final_latent, states[-1], atol=ATOL, rtol=0)

        # latents[k + 1] is the state after latents[k]: scoring the stored transition gives the
        # stored log-prob, and the implied noise is standard normal. A non-successor would score
        # far lower (std is ~0.1-0.5, the latents' scale ~1).
        for k in range(2):
            x, nxt = res.latents[k][None], res.latents[k + 1][None]
            v = tiny_sd3.predict_velocity(x, res.sigmas[k : k + 1], res.conditioning, GUIDANCE)
            scored = sde_step(model_output=v, sigma=res.sigmas[k], sigma_next=res.sigmas_next[k],
                              sample=x, noise_level=0.7, prev_sample=nxt)
            torch.testing.assert_close(scored.log_prob[0], res.log_probs[k], atol=1e-4, rtol=0)
            eps = (nxt - scored.mean) / scored.std[0]
            assert abs(eps.pow(2).mean().item() - 1.0) < 0.15
            assert abs(eps.mean().item()) < 0.1


def test_window_size_zero_records_every_step(tiny_sd3):
    with engine_for(tiny_sd3, max_num_seqs=2) as engine:
        (res,) = engine.generate([request(sde_window_size=0, sde_window_range=None)], timeout_s=TIMEOUT_S)
    assert res.window == (0, STEPS)
    assert res.latents.shape[0] == STEPS + 1 and res.log_probs.shape == (STEPS,)
    assert torch.all(res.log_probs != 0)


# --- 5. explicit initial noise, bad requests, failures ------------------------------------
def test_explicit_initial_noise_is_used(tiny_sd3):
    noise = torch.randn(tiny_sd3.latent_shape(H, W), generator=torch.Generator().manual_seed(99))
    ode = dict(kernel="ode", noise_level=0.0, sde_window_size=0, sde_window_range=None)
    reqs = [
        request("same noise", seed=1, initial_noise=noise, **ode),
        request("same noise", seed=2, initial_noise=noise, **ode),
        request("same noise", seed=1, **ode),  # noise from the seed instead
    ]
    with engine_for(tiny_sd3, max_num_seqs=4) as engine:
        a, b, seeded = engine.generate(reqs, timeout_s=TIMEOUT_S)
    torch.testing.assert_close(a.latents[0], noise, atol=0, rtol=0)
    torch.testing.assert_close(a.final_latent, b.final_latent, atol=ATOL, rtol=0)
    assert (a.image.int() - b.image.int()).abs().max() <= 1  # decoded in one batch: rounding
    assert not torch.allclose(a.final_latent, seeded.final_latent, atol=1e-2)
    # The caller's tensor is not modified in place.
    torch.testing.assert_close(noise, torch.randn(noise.shape, generator=torch.Generator().manual_seed(99)))


def test_wrong_shaped_noise_fails_its_request_with_a_clear_error(tiny_sd3):
    bad = request(initial_noise=torch.zeros(4, 8, 8))
    expected = re.escape(f"initial_noise has shape (4, 8, 8), expected {tiny_sd3.latent_shape(H, W)}")
    with engine_for(tiny_sd3, max_num_seqs=2) as engine:
        with pytest.raises(ValueError, match=expected):  # from submit or from the future
            engine.submit(bad).result(timeout=TIMEOUT_S)
        # Today the bad request stops the whole engine (native.py fails everything after an
        # exception in its loop); either way the next call answers at once instead of hanging.
        t0 = time.monotonic()
        try:
            (result,) = engine.generate([request()], timeout_s=2.0)
            assert result.final_latent.shape == tiny_sd3.latent_shape(H, W)
        except RolloutEngineError as err:
            assert "initial_noise" in str(err)
        assert time.monotonic() - t0 < 2.0


def test_forward_error_reaches_every_waiting_caller(tiny_sd3):
    def hook(i):
        if i == 2:
            raise RuntimeError("boom in forward 2")

    with engine_for(SpyModel(tiny_sd3, hook), max_num_seqs=4, max_wait_ms=50) as engine:
        t0 = time.monotonic()
        other_caller = engine.submit_many([request(seed=s) for s in (7, 8)])  # running too
        with pytest.raises(RuntimeError, match="boom in forward 2"):
            engine.generate([request(seed=s) for s in range(3)], timeout_s=5.0)
        for future in other_caller:
            with pytest.raises(RuntimeError, match="boom in forward 2"):
                future.result(timeout=5.0)
        assert time.monotonic() - t0 < 5.0
        with pytest.raises(RolloutEngineError, match="boom in forward 2"):
            engine.generate([request()], timeout_s=1.0)


def test_generate_times_out_instead_of_hanging(tiny_sd3):
    release = threading.Event()
    spy = SpyModel(tiny_sd3, lambda i: release.wait(5.0) if i == 0 else None)
    with engine_for(spy, max_num_seqs=2) as engine:
        t0 = time.monotonic()
        try:
            with pytest.raises(RolloutEngineError, match="timed out"):
                engine.generate([request()], timeout_s=0.3)
        finally:
            release.set()
        assert time.monotonic() - t0 < 5.0


def test_closed_engine_refuses_work(tiny_sd3):
    engine = NativeDiffusionEngine(tiny_sd3, max_num_seqs=2)
    engine.close()
    with pytest.raises(RolloutEngineError, match="closed"):
        engine.submit(request())
    with pytest.raises(ValueError, match="max_num_seqs=0"):
        NativeDiffusionEngine(tiny_sd3, max_num_seqs=0)


# --- 6. batch keys -----------------------------------------------------------------------
def test_different_batch_keys_never_share_a_forward(tiny_sd3):
    # Three keys, interleaved: two guidance scales at 32 px and one at 48 px.
    reqs = []
    for i in range(3):
        reqs += [request("keys", seed=i), request("keys", seed=10 + i, guidance_scale=1.0),
                 request("keys", seed=20 + i, height=48, width=48)]
    spy = SpyModel(tiny_sd3)
    with engine_for(spy, max_num_seqs=16) as engine:
        results = engine.generate(reqs, timeout_s=TIMEOUT_S)
        stats = dict(engine.stats)
    assert stats["samples"] == 9 and stats["forward_batch_sum"] == 9 * STEPS
    # Each forward holds exactly the three samples of one key (mixing would give 6 or 9).
    assert [f["batch"] for f in spy.forwards] == [3] * (3 * STEPS)
    keys = {(f["guidance"], f["shape"]) for f in spy.forwards}
    small, large = tiny_sd3.latent_shape(H, W), tiny_sd3.latent_shape(48, 48)
    assert keys == {(GUIDANCE, small), (1.0, small), (GUIDANCE, large)}
    # And each sample is what it would be alone (with its own guidance and size).
    for req, res in zip(reqs[:3], results[:3]):
        assert_same_result(res, run_alone(tiny_sd3, req))
    assert results[2].image.shape == (48, 48, 3)


# --- 7. weight sync ----------------------------------------------------------------------
def test_sync_weights_makes_engine_sample_from_the_source(make_sd3):
    rollout_model, trainer_model = make_sd3(), make_sd3()
    lora = trainer_model.named_trainable_tensors()
    assert lora and all("lora" in name for name in lora), sorted(lora)[:4]
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in trainer_model.trainable_parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))

    noise = torch.randn(rollout_model.latent_shape(H, W), generator=torch.Generator().manual_seed(1))
    req = dict(prompt="sync", seed=4, kernel="ode", noise_level=0.0, sde_window_size=0,
               sde_window_range=None, initial_noise=noise)
    _, base_states, _ = reference_trajectory(rollout_model, request(**req))
    _, trained_states, _ = reference_trajectory(trainer_model, request(**req))
    assert not torch.allclose(base_states[-1], trained_states[-1], atol=1e-3)  # the change matters

    with engine_for(rollout_model, max_num_seqs=2) as engine:
        (before,) = engine.generate([request(**req)], timeout_s=TIMEOUT_S)
        engine.sync_weights(trainer_model, version=3)
        (after,) = engine.generate([request(**req)], timeout_s=TIMEOUT_S)
        assert engine.weight_version == 3
        # Colocated: the same object only records the version.
        engine.sync_weights(rollout_model, version=4)
        assert engine.weight_version == 4

    torch.testing.assert_close(before.final_latent, base_states[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(after.final_latent, trained_states[-1], atol=ATOL, rtol=0)
    for name, value in trainer_model.named_trainable_tensors().items():
        torch.testing.assert_close(rollout_model.named_trainable_tensors()[name], value, atol=0, rtol=0)


# --- 8. choose_sde_window ----------------------------------------------------------------
def test_choose_sde_window_size_zero_is_every_step():
    assert choose_sde_window(3, 10, 0, None) == (0, 10)
    assert choose_sde_window(3, 10, 0, (2, 5)) == (0, 10)  # size 0 ignores the range


def test_choose_sde_window_is_seeded_and_covers_the_range():
    starts = {choose_sde_window(seed, 10, 3, (2, 8))[0] for seed in range(200)}
    assert starts == {2, 3, 4, 5}  # every start in [lo, hi - size], nothing outside
    assert all(choose_sde_window(s, 10, 3, (2, 8)) == choose_sde_window(s, 10, 3, (2, 8)) for s in range(20))
    assert choose_sde_window(0, 6, 6, None) == (0, 6)  # a window as big as the range
    assert choose_sde_window(9, 6, 2, (4, 6)) == (4, 6)


@pytest.mark.parametrize(
    "size, window_range",
    [(2, (0, 11)), (2, (-1, 4)), (2, (4, 4)), (2, (5, 3)), (4, (0, 3)), (11, None)],
)
def test_choose_sde_window_rejects_bad_ranges(size, window_range):
    with pytest.raises(ValueError, match="does not fit range"):
        choose_sde_window(0, 10, size, window_range)

"""Rollout tensors stay on the device (omni_rl/rollout/diffusion_sampling.py).

Counted with `HostSyncCounter` (`aten._local_scalar_dense` / `aten.item`, what turns a device
tensor into a Python number and, on an accelerator, waits for the device):

- 0 host syncs in every denoising iteration of the native engine's loop (`advance`), on the tiny
  SD3 and on a two-stream (video + audio) model, with SDE windows, two kernels and samples
  joining and leaving the batch;
- the running batch's conditioning is concatenated once per batch, not once per iteration;
- a group's shared initial noise travels as a seed (no tensor in the request) and gives the bits
  the explicit tensor gave;
- `rollout.backend_options.trajectory_device`: "device" leaves a result's tensors where the model is, an unknown
  value is refused at load; on a GPU (`gpu` marker) "cpu" gives pinned host tensors, and the same
  loop runs under `torch.cuda.set_sync_debug_mode("error")`.
"""
from __future__ import annotations

import pytest
import torch

from omni_rl.algos import latent_streams as ls
from omni_rl.cli import main
from omni_rl.rollout.diffusion_sampling import (
    BatchConditioning,
    advance,
    check_trajectory_device,
    encode_conditionings,
    finish_samples,
    start_sample,
)
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.server.protocol import encode_message
from omni_rl.rollout.types import DiffusionRequest
from omni_rl.utils.host_syncs import HostSyncCounter

from tests.omni_rl.rollout.two_stream_model import TwoStreamModel


def sd3_request(seed: int, **overrides) -> DiffusionRequest:
    fields = dict(prompt=f"prompt {seed % 3}", seed=seed, height=32, width=32, num_steps=6, guidance_scale=4.5,
                  kernel="sde", noise_level=0.7, sde_window_size=2, sde_window_range=(0, 4))
    fields.update(overrides)
    return DiffusionRequest(**fields)


def stream_request(seed: int, **overrides) -> DiffusionRequest:
    fields = dict(prompt=f"clip {seed}", seed=seed, height=16, width=16, num_frames=5, num_steps=4, guidance_scale=3.0,
                  kernel="sde", noise_level=0.7, sde_window_size=2, sde_window_range=(0, 3))
    fields.update(overrides)
    return DiffusionRequest(**fields)


def run_counting(model, requests, max_num_seqs, admit_later=(), trajectory_device="device"):
    """The native engine's loop (admit, advance, finish) with each iteration's host syncs counted;
    `admit_later` requests join after the second iteration. Returns (results, syncs per iteration,
    conditioning builds)."""
    def admit(reqs):
        return [start_sample(model, r, c) for r, c in zip(reqs, encode_conditionings(model, reqs))]

    running, results, per_iteration, later = admit(requests), [], [], list(admit_later)
    conditioning = BatchConditioning()
    while running:
        with HostSyncCounter() as syncs:
            batch = advance(model, running, max_num_seqs, conditioning)
        per_iteration.append(syncs.count)
        finished = [r for r in batch if r.done]
        if finished:
            results += finish_samples(model, finished, 0, trajectory_device)
            for r in finished:
                running.remove(r)
        if len(per_iteration) == 2 and later:
            running += admit(later)
            later = []
    return results, per_iteration, conditioning.builds


def test_no_host_sync_in_any_denoising_iteration_of_the_tiny_sd3(make_sd3):
    model = make_sd3()
    requests = [sd3_request(s) for s in range(3)] + [sd3_request(7, kernel="cps", sde_window_size=0, sde_window_range=None)]
    results, per_iteration, _ = run_counting(model, requests, max_num_seqs=3, admit_later=[sd3_request(11)])
    assert len(results) == 5 and len(per_iteration) >= 6
    assert per_iteration == [0] * len(per_iteration), per_iteration


def test_no_host_sync_in_any_denoising_iteration_of_a_two_stream_model():
    model = TwoStreamModel()
    results, per_iteration, _ = run_counting(model, [stream_request(s) for s in range(3)], max_num_seqs=4)
    assert len(results) == 3 and per_iteration == [0] * 4, per_iteration


def test_the_same_results_as_the_native_engine(make_sd3):
    """The counted loop is the engine's loop: the same bits for requests admitted together."""
    model = make_sd3()
    requests = [sd3_request(s) for s in range(4)]
    counted, _, _ = run_counting(model, requests, max_num_seqs=4)
    engine = NativeDiffusionEngine(model, max_num_seqs=4, max_wait_ms=5000)
    try:
        served = engine.generate([sd3_request(s) for s in range(4)], timeout_s=600)
    finally:
        engine.close()
    for a, b in zip(counted, served):
        assert torch.equal(a.latents, b.latents) and torch.equal(a.log_probs, b.log_probs)


def test_the_batch_conditioning_is_built_once_per_batch(make_sd3):
    model = make_sd3()
    # Four samples of six steps in one batch: six iterations, one batch, one concatenation.
    _, per_iteration, builds = run_counting(model, [sd3_request(s) for s in range(4)], max_num_seqs=4)
    assert len(per_iteration) == 6 and builds == 1
    # A sample joining after the second iteration changes the batch once, and its leaving again.
    _, per_iteration, builds = run_counting(model, [sd3_request(s) for s in range(2)], max_num_seqs=4,
                                            admit_later=[sd3_request(9)])
    assert builds == 3, (builds, per_iteration)


def test_a_group_noise_travels_as_a_seed_and_gives_the_tensors_bits(make_sd3):
    model = make_sd3()
    shape = model.latent_shape(32, 32, 1)
    explicit = ls.randn(shape, generator=torch.Generator().manual_seed(1234))
    (cond,) = encode_conditionings(model, [sd3_request(1)])
    by_tensor = start_sample(model, sd3_request(1, initial_noise=explicit), cond)
    by_seed = start_sample(model, sd3_request(1, noise_seed=1234), cond)
    assert torch.equal(by_tensor.x, by_seed.x)
    # Two requests of a group: the same start, their own step noise (their own seeds).
    other = start_sample(model, sd3_request(2, noise_seed=1234), cond)
    assert torch.equal(other.x, by_seed.x)
    # On the wire a seed is no tensor at all.
    assert len(encode_message(sd3_request(1, noise_seed=1234))) < len(encode_message(sd3_request(1, initial_noise=explicit)))


def test_the_family_sends_a_groups_noise_as_one_seed(tmp_path):
    from omni_rl.compose import load_config
    from omni_rl.trainer import PPOTrainer

    cfg = load_config(["algo.family_options.same_noise_in_group=true", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=3",
                       "trainer.mini_batch_size=6", "trainer.micro_batch_size=3", "trainer.val_every=0",
                       "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", f"trainer.output_dir={tmp_path / 'run'}"])
    trainer = PPOTrainer(cfg)
    try:
        requests, _, groups = trainer.family.rollout_requests(trainer.sampler.prompts_for_step(0), step=1)
    finally:
        trainer.actors.close()
    assert all(r.initial_noise is None for r in requests)
    seeds = {g: {r.noise_seed for r, gg in zip(requests, groups) if gg == g} for g in set(groups)}
    assert all(len(s) == 1 and None not in s for s in seeds.values()) and len({*seeds[0], *seeds[1]}) == 2


def test_trajectories_stay_where_the_model_is_by_default(make_sd3):
    model = make_sd3()
    results, _, _ = run_counting(model, [sd3_request(1)], max_num_seqs=1)
    assert results[0].latents.device == model.device and results[0].log_probs.device == model.device
    with pytest.raises(ValueError, match="rollout.backend_options.trajectory_device='gpu': expected one of device, cpu"):
        check_trajectory_device("gpu")


def test_an_unknown_trajectory_device_is_one_error_line(capsys):
    assert main(["--cfg", "rollout.backend_options.trajectory_device=host"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: rollout.backend_options.trajectory_device='host': expected device"), err


@pytest.mark.gpu
@pytest.mark.parametrize("trajectory_device", ["device", "cpu"])
def test_the_denoising_loop_never_syncs_on_a_gpu(tiny_sd3_path, accel_device, trajectory_device):
    if not accel_device.startswith("cuda"):
        pytest.skip("torch.cuda.set_sync_debug_mode needs CUDA")
    from omni_rl.config.schema import ModelConfig
    from omni_rl.models import build_model

    model = build_model(ModelConfig(path=str(tiny_sd3_path)), torch.device(accel_device))
    requests = [sd3_request(s) for s in range(4)]
    running = [start_sample(model, r, c) for r, c in zip(requests, encode_conditionings(model, requests))]
    torch.cuda.synchronize()
    conditioning, results = BatchConditioning(), []
    while running:
        torch.cuda.set_sync_debug_mode("error")  # any synchronizing op in an iteration raises
        try:
            batch = advance(model, running, 4, conditioning)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        finished = [r for r in batch if r.done]
        if finished:
            results += finish_samples(model, finished, 0, trajectory_device)
            for r in finished:
                running.remove(r)
    assert len(results) == 4
    for result in results:
        if trajectory_device == "cpu":
            assert result.latents.device.type == "cpu" and result.latents.is_pinned()
        else:
            assert result.latents.device == model.device

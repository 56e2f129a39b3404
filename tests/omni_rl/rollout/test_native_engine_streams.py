"""The native engine, the batch and the diffusion family on a model with two latent streams.

`TwoStreamModel` denoises a video and an audio latent in one forward (each stream's velocity
depends on both). What holds for one stream holds for the pair: a sample is the same alone and
packed with others, the trainer's replay of a trajectory gives the rollout's log-probs, the
losses that read transition means get both streams, and a whole update step runs.
"""
import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.data.diffusion_batch import DiffusionBatch
from omni_rl.engine.local import LocalEngine
from omni_rl.families.diffusion import DiffusionFamily
from omni_rl.families.update import run_update
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.types import DiffusionRequest
from omni_rl.algos import latent_streams as ls
from omni_rl.algos.latent_streams import LatentStreams

from tests.omni_rl.rollout.two_stream_model import AUDIO, VIDEO, TwoStreamModel

TIMEOUT_S = 600.0


def request(prompt: str, seed: int, **overrides) -> DiffusionRequest:
    fields = dict(prompt=prompt, seed=seed, height=16, width=16, num_frames=5, num_steps=4, guidance_scale=3.0,
                  kernel="sde", noise_level=0.7, sde_window_size=2, sde_window_range=(0, 3))
    fields.update(overrides)
    return DiffusionRequest(**fields)


def generate(model, requests, max_num_seqs):
    engine = NativeDiffusionEngine(model, max_num_seqs=max_num_seqs)
    try:
        return engine.generate(requests, timeout_s=TIMEOUT_S), dict(engine.stats)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def model():
    return TwoStreamModel()


def test_a_sample_is_the_same_alone_and_packed(model):
    target = request("a drum solo", seed=5)
    (alone,), _ = generate(model, [target], 1)
    batch = [request(f"companion {i}", seed=100 + i) for i in range(3)] + [request("a drum solo", seed=5)]
    packed, stats = generate(model, batch, 4)
    assert stats["forward_batch_sum"] == 4 * 4  # all four in every forward
    got = packed[3]
    assert isinstance(got.latents, LatentStreams) and ls.shape_of(got.latents) == {"video": (3, *VIDEO), "audio": (3, *AUDIO)}
    for name in ("video", "audio"):
        torch.testing.assert_close(got.latents[name], alone.latents[name], atol=1e-5, rtol=0)
        torch.testing.assert_close(got.final_latent[name], alone.final_latent[name], atol=1e-5, rtol=0)
    torch.testing.assert_close(got.log_probs, alone.log_probs, atol=1e-5, rtol=0)
    assert not torch.allclose(packed[0].final_latent["audio"], got.final_latent["audio"], atol=1e-3)
    assert got.image.shape == (2, 4, 4, 3) and got.image.dtype == torch.uint8  # [T, H, W, C]
    assert got.audio.shape == (1, 32) and got.sample_rate == 16000
    torch.testing.assert_close(got.audio, alone.audio, atol=1e-5, rtol=0)


def test_an_initial_noise_of_the_wrong_streams_is_refused(model):
    engine = NativeDiffusionEngine(model, max_num_seqs=2)
    try:
        bad = LatentStreams({"video": torch.zeros(VIDEO)})
        with pytest.raises(ValueError, match="initial_noise has shape"):
            engine.submit(request("x", seed=1, initial_noise=bad))
    finally:
        engine.close()


@pytest.mark.parametrize("loss", ["flow_grpo", "flow_dppo"])
def test_the_trainer_replays_both_streams_and_updates(model, loss):
    cfg = load_config([f"algo.policy_loss={loss}", "trainer.mini_batch_size=4", "trainer.micro_batch_size=2",
                       "trainer.prompts_per_step=1", "trainer.samples_per_prompt=4"])
    model.net.requires_grad_(True)
    family = DiffusionFamily(cfg, model)
    results, _ = generate(model, [request(f"p{i}", seed=i) for i in range(4)], 4)
    batch = DiffusionBatch.from_results(results, [{}] * 4, [0, 0, 0, 0])
    assert batch.audio.shape == (4, 1, 32) and batch.sample_rate == 16000
    assert batch.select([2]).audio.shape == (1, 1, 32)
    policy = family.behaviour_policy(batch, micro_batch_size=2)
    torch.testing.assert_close(policy.log_probs, batch.rollout_log_probs, atol=1e-5, rtol=0)
    if loss == "flow_dppo":
        assert ls.shape_of(policy.means) == {"video": (4, 2, *VIDEO), "audio": (4, 2, *AUDIO)}
    else:
        assert policy.means is None
    batch.old_log_probs, batch.old_means = policy.log_probs, policy.means
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    before = {k: v.clone() for k, v in model.named_trainable_tensors().items()}
    out = run_update(LocalEngine(model, cfg.optim), family, batch, cfg, step=1)
    assert out["maxima"]["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6
    after = model.named_trainable_tensors()
    assert any(not torch.equal(before[k], after[k]) for k in before)

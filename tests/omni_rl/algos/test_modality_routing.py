"""Tests for omni_rl.algos.modality_routing: each stream's advantage follows its own reward, the
log-prob splits exactly over the streams, and a stream no reward scores gets no gradient (FlowGRPO
and DiffusionNFT)."""
import pytest
import torch

from omni_rl.algos import latent_streams as ls
from omni_rl.algos.advantages import get_advantage_estimator
from omni_rl.algos.flow_sde import gaussian_log_prob
from omni_rl.algos.forward_losses import FORWARD_LOSSES, ForwardLossInput
from omni_rl.algos.latent_streams import LatentStreams
from omni_rl.algos.modality_routing import (
    routed_advantages, routed_loss, stream_columns, stream_rewards, stream_routes,
)
from omni_rl.algos.policy_losses import DIFFUSION_LOSSES, StepLossInput

GRPO = get_advantage_estimator("grpo")
MODALITIES = {"video_brightness": frozenset({"video"}), "clip_score": frozenset({"image", "text"}),
              "audio_loudness": frozenset({"audio"}), "av_sync": frozenset({"video", "audio"})}
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def _streams(n=8):
    return LatentStreams({"video": torch.zeros(n, 3, 2, 4, 4), "audio": torch.zeros(n, 2, 5, 4)})


def test_routes_send_each_reward_to_the_streams_of_its_modalities():
    routes = stream_routes(MODALITIES, ("video", "audio"))
    assert routes == {"video": ("video_brightness", "clip_score", "av_sync"), "audio": ("audio_loudness", "av_sync")}
    with pytest.raises(ValueError, match="'depth'"):
        stream_routes(MODALITIES, ("video", "depth"))


def test_each_streams_advantage_follows_its_own_reward():
    torch.manual_seed(0)
    video = torch.randn(8)
    audio = -3.0 * torch.randn(8) + 5.0  # another scale, uncorrelated with the video's
    per_reward = {"video_brightness": video, "audio_loudness": audio}
    weights = {"video_brightness": 2.0, "audio_loudness": 0.5}
    routes = stream_routes({k: MODALITIES[k] for k in per_reward}, ("video", "audio"))
    rewards = stream_rewards(per_reward, weights, routes, 8)
    torch.testing.assert_close(rewards["video"], 2.0 * video)
    torch.testing.assert_close(rewards["audio"], 0.5 * audio)
    adv = routed_advantages(GRPO, rewards, GROUPS, "group", 1e-4)
    for stream, raw in (("video", video), ("audio", audio)):
        a = adv[stream]
        # Its own group-normalised reward: the order within each group is the reward's, the scale 1.
        for g in (0, 1):
            rows = GROUPS == g
            assert torch.equal(torch.argsort(a[rows]), torch.argsort(raw[rows]))
            assert float(a[rows].std(unbiased=False)) == pytest.approx(1.0, abs=1e-3)
    assert not torch.equal(torch.argsort(adv["video"]), torch.argsort(adv["audio"]))


def test_a_failed_reward_is_left_out_and_a_stream_without_rewards_gets_zero_advantage():
    routes = stream_routes({"video_brightness": MODALITIES["video_brightness"]}, ("video", "audio"))
    rewards = stream_rewards({"video_brightness": torch.arange(8.0)}, {"video_brightness": 1.0}, routes, 8)
    assert torch.equal(rewards["audio"], torch.zeros(8))
    adv = routed_advantages(GRPO, rewards, GROUPS, "global", 1e-4)
    assert torch.equal(adv["audio"], torch.zeros(8)) and bool((adv["video"] != 0).all())


def test_the_joint_log_prob_is_the_dimension_weighted_mean_of_the_streams():
    torch.manual_seed(1)
    prev, mean = _streams().map(torch.randn_like), _streams().map(torch.randn_like)
    std = torch.rand(8) + 0.1
    joint = gaussian_log_prob(ls.flat(prev), ls.flat(mean), std)
    cols = stream_columns(prev)
    total = sum(c.stop - c.start for c in cols.values())
    split = sum((c.stop - c.start) / total * gaussian_log_prob(ls.flat(prev)[:, c], ls.flat(mean)[:, c], std)
                for c in cols.values())
    torch.testing.assert_close(split, joint, rtol=1e-5, atol=1e-5)


def _flow_grpo_grad(advantages: LatentStreams | None, joint_advantage: torch.Tensor):
    """d loss / d mean of a FlowGRPO step on two streams, routed or joint, on policy."""
    torch.manual_seed(2)
    prev = ls.flat(_streams().map(torch.randn_like))
    mean = ls.flat(_streams().map(torch.randn_like)).requires_grad_(True)
    old_mean, std = mean.detach().clone(), torch.full((8,), 0.5)
    loss_fn = DIFFUSION_LOSSES.get("flow_grpo")(clip_range=1e-3)
    cols = stream_columns(_streams())

    def part(name, c, adv):
        return loss_fn(StepLossInput(log_prob=gaussian_log_prob(prev[:, c], mean[:, c], std),
                                     old_log_prob=gaussian_log_prob(prev[:, c], old_mean[:, c], std),
                                     advantages=adv, std=std, dt=-0.1))

    if advantages is None:
        loss, _ = loss_fn(StepLossInput(log_prob=gaussian_log_prob(prev, mean, std),
                                        old_log_prob=gaussian_log_prob(prev, old_mean, std),
                                        advantages=joint_advantage, std=std, dt=-0.1))
    else:
        loss, metrics = routed_loss(part, cols, advantages)
        assert set(metrics) >= {"policy/video", "policy/audio"}
    loss.backward()
    return mean.grad[:, cols["video"]], mean.grad[:, cols["audio"]]


def test_flow_grpo_a_video_only_reward_leaves_the_audio_stream_without_gradient():
    routes = stream_routes({"video_brightness": MODALITIES["video_brightness"]}, ("video", "audio"))
    video_reward = torch.arange(8.0) % 3
    rewards = stream_rewards({"video_brightness": video_reward}, {"video_brightness": 1.0}, routes, 8)
    adv = routed_advantages(GRPO, rewards, GROUPS, "global", 1e-4)
    video_grad, audio_grad = _flow_grpo_grad(adv, adv["video"])
    assert torch.equal(audio_grad, torch.zeros_like(audio_grad))
    assert float(video_grad.abs().sum()) > 0
    # Without routing the one advantage reaches the audio stream too, and on policy the routed
    # video gradient is the joint one (the log-prob split is exact).
    joint_video, joint_audio = _flow_grpo_grad(None, adv["video"])
    assert float(joint_audio.abs().sum()) > 0
    torch.testing.assert_close(video_grad, joint_video, rtol=1e-4, atol=1e-7)


def test_diffusion_nft_a_video_only_reward_leaves_the_audio_stream_without_gradient():
    torch.manual_seed(3)
    streams = _streams()
    cols = stream_columns(streams)
    v = ls.flat(streams.map(torch.randn_like)).requires_grad_(True)
    u, x0 = torch.randn_like(v), torch.randn_like(v)
    t = torch.rand(8) * 0.8 + 0.1
    noisy = (1 - t[:, None]) * x0 + t[:, None] * (u + x0)
    adv = LatentStreams({"video": torch.linspace(-2, 2, 8), "audio": torch.zeros(8)})
    nft = FORWARD_LOSSES.get("diffusion_nft")(beta=1.0)

    def part(name, c, a):
        return nft(ForwardLossInput(velocity=v[:, c], target=u[:, c], timesteps=t, noisy=noisy[:, c], clean=x0[:, c],
                                    old_velocity=v.detach()[:, c], advantages=a))

    loss, _ = routed_loss(part, cols, adv)
    loss.backward()
    assert torch.equal(v.grad[:, cols["audio"]], torch.zeros_like(v.grad[:, cols["audio"]]))
    assert float(v.grad[:, cols["video"]].abs().sum()) > 0


def test_routed_loss_refuses_advantages_for_other_streams():
    with pytest.raises(ValueError, match="streams"):
        routed_loss(lambda *a: None, stream_columns(_streams()), LatentStreams({"video": torch.zeros(8)}))

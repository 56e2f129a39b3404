"""Load-time checks that every reward scores what the model makes (omni_rl/compose.py): an image
reward on video needs `video_frames`, an audio reward needs an adapter that makes audio, and
`video_frames` goes only on image rewards. Each fails as one ConfigError line before any model
loads."""
import pytest

from omni_rl.compose import check_components, load_config
from omni_rl.config import OmniConfig, validate_config
from omni_rl.errors import ConfigError
from omni_rl.config.options import NoOptions
from omni_rl.config.schema import DataConfig, ModelConfig, RewardConfig, RewardItemConfig
from omni_rl.models.registry import ADAPTERS, register_adapter


@register_adapter("TestsAudioVideoPipeline")
class AudioVideoAdapter:
    """Stands in for an audio-video adapter (LTX-2): only its class attributes are read."""

    family = "diffusion"
    makes_audio = True
    options_class = NoOptions

    @classmethod
    def check_config(cls, cfg) -> None:  # takes any geometry
        pass


def config(*rewards: RewardItemConfig, num_frames: int = 1, adapter: str = "WanPipeline") -> OmniConfig:
    cfg = OmniConfig(data=DataConfig(prompts=["a cat"]), model=ModelConfig(adapter=adapter),
                     reward=RewardConfig(rewards=list(rewards)))
    cfg.rollout.sampling_options = {"num_frames": num_frames}  # bound by check_components
    return cfg


def error(cfg: OmniConfig) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
        check_components(cfg)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_an_image_reward_on_video_needs_video_frames():
    message = error(config(RewardItemConfig("video_brightness"), RewardItemConfig("brightness"), num_frames=9))
    assert message.startswith("reward.rewards[1]: reward 'brightness' scores images but rollout.sampling_options.num_frames=9")
    assert "set reward.rewards[1].video_frames=4" in message
    check_components(config(RewardItemConfig("brightness", video_frames=4), num_frames=9))
    check_components(config(RewardItemConfig("brightness")))  # images: as before


def test_video_rewards_need_no_video_frames():
    check_components(config(RewardItemConfig("temporal_smoothness"), RewardItemConfig("video_brightness"), num_frames=9))
    imagebind = RewardItemConfig("imagebind", reward_options={"mode": "text_video", "checkpoint": "never/loaded.pth"})
    check_components(config(imagebind, num_frames=9))


@pytest.mark.parametrize("item", [
    RewardItemConfig("clap"),
    RewardItemConfig("audio_loudness"),
    RewardItemConfig("imagebind", reward_options={"mode": "audio_video"}),
    RewardItemConfig("imagebind", reward_options={"mode": "text_audio"}),
])
def test_an_audio_reward_needs_an_adapter_that_makes_audio(item):
    message = error(config(item, num_frames=9))
    assert message.startswith(f"reward.rewards[0]: reward {item.name!r} scores audio")
    assert "model.adapter='WanPipeline' (WanAdapter) makes no audio" in message
    check_components(config(item, num_frames=9, adapter="TestsAudioVideoPipeline"))


def test_video_frames_only_on_image_rewards():
    message = error(config(RewardItemConfig("temporal_smoothness", video_frames=4), num_frames=9))
    assert message.startswith("reward.rewards[0].video_frames=4: reward 'temporal_smoothness' scores video itself")
    imagebind = RewardItemConfig("imagebind", reward_options={"mode": "all"}, video_frames=2)
    assert "scores video itself" in error(config(imagebind, num_frames=9, adapter="TestsAudioVideoPipeline"))
    message = error(config(RewardItemConfig("audio_loudness", video_frames=2), adapter="TestsAudioVideoPipeline"))
    assert message.startswith("reward.rewards[0].video_frames=2: reward 'audio_loudness' scores audio, not images")


@pytest.mark.parametrize("frames", [0, -1])
def test_video_frames_and_num_frames_are_at_least_one(frames):
    assert error(config(RewardItemConfig("brightness", video_frames=frames))).startswith(
        f"reward.rewards[0].video_frames={frames}: expected an integer >= 1"
    )
    assert error(config(RewardItemConfig("brightness"), num_frames=frames)).startswith(f"rollout.sampling_options.num_frames={frames}")


def test_a_bad_imagebind_mode_names_the_kwargs():
    message = error(config(RewardItemConfig("imagebind", reward_options={"mode": "vid"})))
    assert message.startswith("reward.rewards[0].reward_options: reward 'imagebind'") and "mode='vid'" in message


def test_the_overrides_load_through_hydra():
    wan = ["model.adapter=WanPipeline", "model.path=tiny:wan22", "rollout.sampling_options.num_frames=9"]
    cfg = load_config([*wan, "reward.rewards=[{name: brightness, video_frames: 4}]"])
    assert cfg.rollout.sampling_options.num_frames == 9 and cfg.reward.rewards[0].video_frames == 4
    with pytest.raises(ConfigError, match=r"reward.rewards\[0\].video_frames=4"):
        load_config([*wan, "reward.rewards=[{name: brightness}]"])
    assert "TestsAudioVideoPipeline" in ADAPTERS


def test_modality_routing_needs_a_model_of_several_streams_and_a_loss_with_advantages():
    cfg = config(RewardItemConfig("video_brightness"), num_frames=9)
    cfg.algo.advantage_options = {"modality_routing": True}
    message = error(cfg)
    assert message.startswith("algo.advantage_options.modality_routing=true: expected a diffusion adapter that denoises")
    assert "model.adapter='WanPipeline' has one stream" in message
    routed = config(RewardItemConfig("video_brightness"), RewardItemConfig("audio_loudness"), num_frames=9,
                    adapter="TestsAudioVideoPipeline")
    routed.algo.advantage_options = {"modality_routing": True}
    check_components(routed)
    routed.algo.policy_loss = "diffusion_dpo"
    assert "algo.policy_loss='diffusion_dpo' trains on pairs" in error(routed)

"""The trainer's modality routing (`stream_advantages`): each stream's advantage comes from the
configured rewards that score its modality, as the reward registry declares them."""
import torch

from omni_rl.algos.advantages import AdvantageInput, AdvantageOptions, get_advantage_estimator
from omni_rl.config.schema import RewardItemConfig
from omni_rl.plugins import load_plugins
from omni_rl.trainer.ppo_trainer import stream_advantages


def test_each_stream_gets_the_advantage_of_its_own_rewards():
    load_plugins()
    items = [RewardItemConfig("video_brightness", weight=2.0), RewardItemConfig("audio_loudness", weight=0.5)]
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    video, audio = torch.tensor([0.1, 0.5, 0.3, 0.2, 0.2, 0.9]), torch.tensor([0.9, 0.1, 0.5, 0.4, 0.6, 0.5])
    grpo, options = get_advantage_estimator("grpo"), AdvantageOptions(std_mode="group")
    out = stream_advantages(items, grpo, options, ("video", "audio"), groups,
                            {"video_brightness": video, "audio_loudness": audio})
    assert out.names == ("video", "audio")
    torch.testing.assert_close(out["video"], grpo(AdvantageInput(2.0 * video, groups, "group")))
    torch.testing.assert_close(out["audio"], grpo(AdvantageInput(0.5 * audio, groups, "group")))
    # A video-only run: the audio stream's advantage is zero.
    alone = stream_advantages(items[:1], grpo, options, ("video", "audio"), groups, {"video_brightness": video})
    assert torch.equal(alone["audio"], torch.zeros(6))

"""Frame counts and sizes a model cannot take fail at config load, before any weights load
(`DiffusionModelBase.check_config`, run by `omni_rl.compose.check_components`)."""
import pytest

from omni_rl.compose import load_config
from omni_rl.families.diffusion import DiffusionOptions
from tests.config_errors import load_error


def test_an_image_model_refuses_frames():
    message = load_error("rollout.sampling_options.num_frames=5")
    assert message == "rollout.sampling_options.num_frames=5: StableDiffusion3Pipeline makes images; expected 1"


@pytest.mark.parametrize("key, value", [("rollout.sampling_options.fps", 0.0), ("rollout.sampling_options.num_frames", 0), ("algo.family_options.timestep_fraction", 0.0),
                                        ("algo.family_options.timestep_fraction", 1.5)])
def test_out_of_range_video_and_dance_keys(key, value):
    assert load_error(f"{key}={value}").startswith(f"{key}={value}: expected")


def test_the_image_defaults_still_load():
    cfg = load_config([])
    assert cfg.rollout.sampling_options.num_frames == 1 and DiffusionOptions().timestep_fraction == 1.0

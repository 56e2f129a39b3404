"""omni_rl/models/limits.py: sizes and frame counts past a model's position encoding, and samples
too large for the machine, refused before the model loads with the largest valid value named
(issue 29 item 12)."""
import json

import pytest

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.config import ConfigError
from omni_rl.models.limits import ComponentConfigs, check_positions, check_sample_memory
from omni_rl.models.registry import ADAPTERS
from omni_rl.plugins import load_plugins

load_plugins()  # the adapters register themselves


def _configs(tmp_path, **components):
    for name, config in components.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    return ComponentConfigs(tmp_path)


def test_check_positions_names_the_largest_valid_value():
    check_positions("rollout.height", 512, 16, 32, "a table")
    with pytest.raises(ValueError, match=r"rollout.height=528: past a table, 32 positions of 16 px; the largest valid value is 512"):
        check_positions("rollout.height", 528, 16, 32, "a table")


def test_sd3_sizes_past_its_position_embedding(tmp_path):
    # SD3.5's own numbers: 384 patches of 2 latent pixels, a VAE of factor 8 (four blocks).
    configs = _configs(tmp_path, transformer={"pos_embed_max_size": 384, "patch_size": 2},
                       vae={"block_out_channels": [128, 256, 512, 512]})
    sd3 = ADAPTERS.get("StableDiffusion3Pipeline")
    sd3.check_model_limits(load_config(["rollout.height=6144", "rollout.width=1024"]), configs)
    with pytest.raises(ValueError, match=r"rollout.width=8192: past StableDiffusion3Pipeline's position embedding .*"
                                         r"384 positions of 16 px; the largest valid value is 6144"):
        sd3.check_model_limits(load_config(["rollout.height=1024", "rollout.width=8192"]), configs)


def test_wan_frames_and_sizes_past_its_rotary_table(tmp_path):
    configs = _configs(tmp_path, transformer={"rope_max_seq_len": 32, "patch_size": [1, 2, 2]},
                       vae={"scale_factor_temporal": 4, "scale_factor_spatial": 8})
    wan = ADAPTERS.get("WanPipeline")
    base = ["recipe=tiny_wan22_flowgrpo"]
    wan.check_model_limits(load_config([*base, "rollout.num_frames=125", "rollout.height=512"]), configs)
    with pytest.raises(ValueError, match=r"rollout.num_frames=129: past WanPipeline's rotary position table .*32 positions "
                                         r"of 4 frames; the largest valid value is 125"):
        wan.check_model_limits(load_config([*base, "rollout.num_frames=129"]), configs)
    with pytest.raises(ValueError, match=r"rollout.height=528: .*the largest valid value is 512"):
        wan.check_model_limits(load_config([*base, "rollout.height=528"]), configs)


def test_a_sample_larger_than_the_machine_is_refused_at_load():
    check_sample_memory(64, 64, 1, memory_bytes=64 * 64 * 12)
    with pytest.raises(ValueError, match=r"one sample alone is 48.0 KB decoded .* more than this machine's 47.9 KB"):
        check_sample_memory(64, 64, 1, memory_bytes=64 * 64 * 12 - 100)
    with pytest.raises(ConfigError, match=r"rollout.height=10000000 x rollout.width=10000000 x rollout.num_frames=1: "
                                          r"one sample alone is .* PB decoded"):
        load_config(["rollout.height=10000000", "rollout.width=10000000"])


def test_the_command_line_refuses_a_size_past_the_tiny_sd3_in_one_line(tmp_path, capsys):
    # Refused at load when the tiny model is on disk, else as the trainer builds it: one line either way.
    code = main(["recipe=tiny_sd3_flowgrpo", "rollout.height=1024", f"trainer.output_dir={tmp_path}"])
    err = [line for line in capsys.readouterr().err.splitlines() if "Traceback" in line or line.startswith("error")]
    assert code == 2 and err == ["error: rollout.height=1024: past StableDiffusion3Pipeline's position embedding (its "
                                 "transformer's pos_embed_max_size), 32 positions of 2 px; the largest valid value is 64"]

"""omni_rl/models/limits.py: sizes and frame counts past a model's position encoding, and samples
too large for the machine, refused before the model loads with the largest valid value named
(issue 29 item 12)."""
import json

import pytest

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
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
    check_positions("rollout.sampling_options.height", 512, 16, 32, "a table")
    with pytest.raises(ValueError, match=r"rollout.sampling_options.height=528: past a table, 32 positions of 16 px; the largest valid value is 512"):
        check_positions("rollout.sampling_options.height", 528, 16, 32, "a table")


def test_sd3_sizes_past_its_position_embedding(tmp_path):
    # SD3.5's own numbers: 384 patches of 2 latent pixels, a VAE of factor 8 (four blocks).
    configs = _configs(tmp_path, transformer={"pos_embed_max_size": 384, "patch_size": 2},
                       vae={"block_out_channels": [128, 256, 512, 512]})
    sd3 = ADAPTERS.get("StableDiffusion3Pipeline")
    sd3.check_model_limits(load_config(["rollout.sampling_options.height=6144", "rollout.sampling_options.width=1024"]), configs)
    with pytest.raises(ValueError, match=r"rollout.sampling_options.width=8192: past StableDiffusion3Pipeline's position embedding .*"
                                         r"384 positions of 16 px; the largest valid value is 6144"):
        sd3.check_model_limits(load_config(["rollout.sampling_options.height=1024", "rollout.sampling_options.width=8192"]), configs)


def test_wan_frames_and_sizes_past_its_rotary_table(tmp_path):
    configs = _configs(tmp_path, transformer={"rope_max_seq_len": 32, "patch_size": [1, 2, 2]},
                       vae={"scale_factor_temporal": 4, "scale_factor_spatial": 8})
    wan = ADAPTERS.get("WanPipeline")
    base = ["recipe=tiny_wan22_flowgrpo"]
    wan.check_model_limits(load_config([*base, "rollout.sampling_options.num_frames=125", "rollout.sampling_options.height=512"]), configs)
    with pytest.raises(ValueError, match=r"rollout.sampling_options.num_frames=129: past WanPipeline's rotary position table .*32 positions "
                                         r"of 4 frames; the largest valid value is 125"):
        wan.check_model_limits(load_config([*base, "rollout.sampling_options.num_frames=129"]), configs)
    with pytest.raises(ValueError, match=r"rollout.sampling_options.height=528: .*the largest valid value is 512"):
        wan.check_model_limits(load_config([*base, "rollout.sampling_options.height=528"]), configs)


def test_a_sample_larger_than_the_machine_is_refused_at_load():
    check_sample_memory(64, 64, 1, memory_bytes=64 * 64 * 12)
    with pytest.raises(ValueError, match=r"one sample alone is 48.0 KB decoded .* more than this machine's 47.9 KB"):
        check_sample_memory(64, 64, 1, memory_bytes=64 * 64 * 12 - 100)
    with pytest.raises(ConfigError, match=r"rollout.sampling_options.height=10000000 x rollout.sampling_options.width=10000000 x rollout.sampling_options.num_frames=1: "
                                          r"one sample alone is .* PB decoded"):
        load_config(["rollout.sampling_options.height=10000000", "rollout.sampling_options.width=10000000"])


def test_the_command_line_refuses_a_size_past_the_tiny_sd3_in_one_line(tmp_path, capsys):
    # Refused at load when the tiny model is on disk, else as the trainer builds it: one line either way.
    code = main(["recipe=tiny_sd3_flowgrpo", "rollout.sampling_options.height=1024", f"trainer.output_dir={tmp_path}"])
    err = [line for line in capsys.readouterr().err.splitlines() if "Traceback" in line or line.startswith("error")]
    assert code == 2 and err == ["error: rollout.sampling_options.height=1024: past StableDiffusion3Pipeline's position embedding (its "
                                 "transformer's pos_embed_max_size), 32 positions of 2 px; the largest valid value is 64"]


# --- issue 45 M5 and item 4: the step, not one sample ------------------------------------------
from omni_rl.models.limits import check_step_memory, physical_memory, step_memory  # noqa: E402

HUNYUAN = "recipe=tiny_hunyuan_video15_flowgrpo"  # 4 prompts x 8 samples, max_num_seqs 32, 8 steps, 32 x 32 px


def test_a_steps_memory_counts_every_sample_the_decoding_batch_and_the_trajectories():
    cfg = load_config([HUNYUAN, "rollout.sampling_options.num_frames=9", "rollout.max_num_seqs=4"])
    need = step_memory(cfg, latent_numel=100)
    # 32 samples; one decoded is 9 x 32 x 32 x 3 = 27,648 uint8 bytes; 4 at once as fp32 is 4 x 4 x that;
    # a trajectory is (8 + 1) points x 100 elements x 4 bytes = 3,600.
    assert (need.samples, need.decoded, need.decoding, need.trajectories) == (32, 32 * 27648, 16 * 27648, 32 * 3600)
    assert step_memory(cfg).trajectories == 0  # a latent of unknown size is not counted


def test_a_step_that_does_not_fit_is_one_line_naming_the_key():
    cfg = load_config([HUNYUAN, "rollout.sampling_options.num_frames=9", "rollout.max_num_seqs=4"])
    total = 32 * 27648 + 16 * 27648 + 32 * 3600
    check_step_memory(cfg, 100, host_bytes=total)  # exactly fits
    with pytest.raises(ValueError) as err:
        check_step_memory(cfg, 100, host_bytes=total - 1)
    assert str(err.value) == (
        "rollout.sampling_options.num_frames=9 (at rollout.sampling_options.height=32 x rollout.sampling_options.width=32): a step's 32 samples "
        "(trainer.prompts_per_step=4 x trainer.samples_per_prompt=8) need 1.4 MB of this machine's 1.4 MB of memory "
        "(864.0 KB decoded (uint8 RGB, all 32, host); 432.0 KB decoding rollout.max_num_seqs=4 at once (fp32 RGB); "
        "112.5 KB of trajectories (rollout.sampling_options.num_steps=8 + 1 latents each, fp32)); use fewer frames, a smaller size, "
        "fewer samples a step or a smaller rollout.max_num_seqs (python main_omni.py ... --plan counts the rest)")


def test_on_an_accelerator_the_host_holds_the_decoded_samples_and_the_device_the_rest():
    cfg = load_config([HUNYUAN, "rollout.sampling_options.num_frames=9", "rollout.max_num_seqs=4"])
    decoded, rest = 32 * 27648, 16 * 27648 + 32 * 3600
    check_step_memory(cfg, 100, on_cpu=False, host_bytes=decoded, device_bytes=rest)
    check_step_memory(cfg, 100, on_cpu=False, host_bytes=decoded, device_bytes=None)  # a device not asked
    with pytest.raises(ValueError, match=r"need 544.5 KB of the rollout device's 544.5 KB of memory"):
        check_step_memory(cfg, 100, on_cpu=False, host_bytes=decoded, device_bytes=rest - 1)
    with pytest.raises(ValueError, match=r"need 864.0 KB of this machine's 864.0 KB of memory"):
        check_step_memory(cfg, 100, on_cpu=False, host_bytes=decoded - 1, device_bytes=rest)


def _frames_one_sample_fits_a_step_does_not() -> int:
    """4k + 1 frames of 32 x 32 px one fp32 sample of which is about a quarter of this machine's
    memory: one sample fits, a step of 32 (and 32 decoded at once) is several times too large."""
    memory = physical_memory()
    return (memory // 4 // (32 * 32 * 12)) // 4 * 4 + 1


@pytest.mark.skipif(physical_memory() is None, reason="the OS does not say how much memory there is")
def test_the_probes_frame_count_is_refused_when_the_config_loads(capsys):
    # issue 45 M5: num_frames=100001 passed (one sample fitted), then the rollout failed on allocation.
    frames = _frames_one_sample_fits_a_step_does_not()
    check_sample_memory(32, 32, frames)  # what main checked: it passes
    with pytest.raises(ConfigError, match=rf"^rollout.sampling_options.num_frames={frames} \(at rollout.sampling_options.height=32 x rollout.sampling_options.width=32\): "
                                          r"a step's 32 samples \(trainer.prompts_per_step=4 x trainer.samples_per_prompt=8\) "
                                          r"need .* of this machine's"):
        load_config([HUNYUAN, f"rollout.sampling_options.num_frames={frames}", "trainer.device=cpu"])


def test_the_hunyuan_latent_from_its_configs(tmp_path):
    from adapters.hunyuan_video15 import HunyuanVideo15Adapter

    configs = _configs(tmp_path, vae={"latent_channels": 16, "temporal_compression_ratio": 4,
                                      "spatial_compression_ratio": 16},
                       transformer={"patch_size": 1, "patch_size_t": 1})
    cfg = load_config([HUNYUAN, "rollout.sampling_options.num_frames=9"])
    # 16 channels x (9 - 1) / 4 + 1 = 3 latent frames x 32 / 16 = 2 x 2.
    assert HunyuanVideo15Adapter.config_latent_numel(cfg, configs) == 16 * 3 * 2 * 2
    assert HunyuanVideo15Adapter.config_latent_numel(cfg, ComponentConfigs(tmp_path / "none")) is None


@pytest.mark.skipif(physical_memory() is None, reason="the OS does not say how much memory there is")
def test_the_trajectories_join_the_check_before_the_load_when_the_configs_are_on_disk(tmp_path, capsys):
    # A model folder with only its configs: the step check with its latents runs before anything loads.
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model_index.json").write_text("{}")
    _configs(folder, vae={"latent_channels": 16, "temporal_compression_ratio": 4, "spatial_compression_ratio": 16},
             transformer={"patch_size": 1, "patch_size_t": 1})
    # 16 x 2 x 2 x 2 = 128 latent elements a sample (5 frames): trajectories of 32 x (N + 1) x 128 x 4 bytes
    # past the machine's memory, while the decoded samples are 32 x 5 x 32 x 32 x 3 bytes.
    steps = physical_memory() // (32 * 128 * 4) + 1
    cfg = load_config([HUNYUAN, f"model.path={folder}", f"rollout.sampling_options.num_steps={steps}", "rollout.sampling_options.sde_window_range=[0,6]",
                       "trainer.device=cpu"])
    from omni_rl.models.geometry import check_model_geometry

    with pytest.raises(ConfigError, match=rf"of trajectories \(rollout.sampling_options.num_steps={steps} \+ 1 latents each, fp32\)"):
        check_model_geometry(cfg)

"""The command line (omni_rl/cli.py, main_omni.py).

Bad configs go through `python main_omni.py` in a subprocess (about a second each), because
what matters there is what a user sees: exit code 2 and one `error:` line on stderr, no
traceback. `--cfg` and `--help` are checked in-process through `main(argv)`.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from omni_rl.cli import main
from omni_rl.config import available_recipes

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_main_omni(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "main_omni.py", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("arg, expected", [
    ("recipe=nope", ["unknown recipe 'nope'", *available_recipes()]),
    ("trainer.totl_steps=3", ["trainer.totl_steps"]),
    ("trainer.total_steps=abc", ["trainer.total_steps", "abc"]),
    ("trainer.pipeline=async trainer.pipeline_options.max_staleness=-1",
     ["trainer.pipeline_options.max_staleness=-1", "expected an integer >= 0"]),
])
def test_bad_config_exits_2_with_one_error_line(arg, expected):
    result = run_main_omni(*arg.split(" "))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for text in expected:
        assert text in lines[0]
    assert result.stdout == ""


def test_cfg_prints_the_composed_config_with_the_overrides(capsys):
    assert main(["--cfg", "trainer.total_steps=17", "rollout.sampling_options.num_steps=9"]) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.trainer.total_steps == 17 and printed.rollout.sampling_options.num_steps == 9
    assert printed.recipe == "tiny_sd3_shapes_counting"
    assert printed.trainer.seed == 42  # a schema default, untouched


def test_cfg_with_a_bad_config_exits_2(capsys):
    assert main(["--cfg", "model.dtype=fp8"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ") and "model.dtype" in captured.err


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_exits_0_and_lists_the_recipes(flag, capsys):
    assert main([flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:")
    for name in available_recipes():
        assert name in out


def test_unknown_option_exits_2(capsys):
    assert main(["--cfgg"]) == 2
    assert "error: unknown option '--cfgg'" in capsys.readouterr().err


def test_cfg_job_is_hydras_spelling_of_cfg(capsys):
    assert main(["--cfg", "job", "trainer.total_steps=17"]) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.trainer.total_steps == 17


def test_a_word_that_is_no_override_exits_2_naming_it(capsys):
    assert main(["trainer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: 'trainer' is not a key=value override")


@pytest.mark.parametrize("args, expected", [
    (["recipe=tiny_wan22_dancegrpo", "rollout.sampling_options.num_frames=6"], ["rollout.sampling_options.num_frames=6", "4k+1", "5 or 9"]),
    (["recipe=tiny_wan22_dancegrpo", "rollout.sampling_options.height=40"], ["rollout.sampling_options.height=40", "multiple of 16", "32 or 48"]),
    (["recipe=tiny_wan22_dancegrpo", "reward.rewards=[{name: brightness}]"],
     ["reward.rewards[0]", "'brightness'", "reward.rewards[0].video_frames=4"]),
    (["recipe=tiny_wan22_dancegrpo", "reward.rewards=[{name: audio_loudness}]"],
     ["reward.rewards[0]", "'audio_loudness'", "makes no audio"]),
    (["recipe=tiny_ltx2_flowgrpo_av", "rollout.sampling_options.fps=16"], ["rollout.sampling_options.fps=16", "expected 24"]),
    (["rollout.sampling_options.num_frames=5"], ["rollout.sampling_options.num_frames=5", "StableDiffusion3Pipeline makes images"]),
])
def test_a_video_config_the_model_cannot_take_exits_2_before_any_model_loads(tmp_path, args, expected):
    cache = tmp_path / "cache"
    result = subprocess.run(
        [sys.executable, "main_omni.py", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMNI_RL_CACHE": str(cache)},
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    assert not cache.exists() or not any(cache.iterdir())  # no tiny model was built, nothing loaded


@pytest.mark.parametrize("arg, expected", [
    ("model.adapter=LTX2Pipeline", ["model adapter LTX2Pipeline: options under model.adapter_options", "stg_scale", "float = 0.0",
                                    "Spatio-temporal guidance"]),
    ("model.adapter=Qwen3OmniMoeForConditionalGeneration", ["/thinker: options under model.adapter_options", "freeze_vision_tower"]),
    ("rollout.backend=server", ["rollout backend server: options under rollout.backend_options", "server_timeout_s", "max_wait_ms"]),
    ("rollout.backend=vllm", ["gpu_memory_utilization", "float = 0.5", "sleep_mode"]),
    ("trainer.backend=ray", ["trainer backend ray: options under trainer.backend_options", "devices_per_node", "int = 1"]),
    ("trainer.engine=fsdp2", ["training engine fsdp2: options under trainer.engine_options", "param_offload"]),
    ("trainer.pipeline=async", ["pipeline async: options under trainer.pipeline_options", "max_staleness", "stale_policy"]),
    ("trainer.pipeline=on_policy", ["pipeline on_policy: options under trainer.pipeline_options (none)"]),
])
def test_options_prints_a_components_options_with_defaults_and_docs(capsys, arg, expected):
    assert main(["--options", arg]) == 0
    out = capsys.readouterr().out
    for text in expected:
        assert text in out, out


@pytest.mark.parametrize("args, expected", [
    (["--options", "model.adapter=NoSuchPipeline"], "model.adapter='NoSuchPipeline': unknown model adapter; registered: "),
    (["--options", "rollout.sampling_options.kernel=sde"], "--options rollout.sampling_options.kernel=sde: expected one of model.adapter=NAME"),
    (["--options"], "--options takes one KEY=NAME"),
])
def test_options_of_an_unknown_component_is_one_error_line_and_exit_2(capsys, args, expected):
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], captured.err


def test_options_through_main_omni_exits_0():
    result = run_main_omni("--options", "trainer.engine=fsdp2")
    assert result.returncode == 0, result.stderr
    assert "optimizer_offload" in result.stdout

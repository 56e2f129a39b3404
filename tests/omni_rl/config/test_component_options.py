"""Each component's options block (`model.adapter_options`, `rollout.backend_options`, `trainer.*_options`):
checked at load against the options class the component declares, bound again where the
component is built, listed by `--options`; a flat key that moved there fails with its new place."""
from __future__ import annotations

import dataclasses

import pytest

from omni_rl.algos import DIFFUSION_LOSSES, FORWARD_LOSSES, TOKEN_LOSSES
from omni_rl.logging import LoggerOptions
from omni_rl.rollout.sde_window import SdeWindowOptions
from omni_rl.algos.rollout_correction import RolloutCorrectionOptions as RolloutCorrectionConfig
from omni_rl.families import MODEL_FAMILIES
from omni_rl.compose import loss_options_class, OPTION_BLOCKS, load_config
import omni_rl
from omni_rl.config.loader import MOVED_KEYS, MOVED_KEYS_REMOVED_IN
from omni_rl.errors import ConfigError
from omni_rl.plugins import load_plugins
from omni_rl.rollout.backends import ROLLOUT_BACKENDS, beside_trainer_problem, shares_model
from omni_rl.workers.reward_worker import RewardWorkerOptions

LTX2 = "recipe=tiny_ltx2_flowgrpo_av"


@pytest.mark.parametrize("override, expected", [
    ("model.stg_scale=1", "model.stg_scale moved: set model.adapter_options.stg_scale (LTX2Pipeline's option)"),
    ("rollout.vllm_sleep_mode=false", "rollout.vllm_sleep_mode moved: set rollout.backend_options.sleep_mode (an option of "
                                      "rollout backends vllm, vllm_omni)"),
    ("trainer.nnodes=2", "trainer.nnodes moved: set trainer.backend_options.nnodes (trainer backend ray's option)"),
    ("trainer.max_staleness=2", "trainer.max_staleness moved: set trainer.pipeline_options.max_staleness"),
    ("reward.num_workers=2", "reward.num_workers moved: set reward.worker_options.num_workers"),
])
def test_a_moved_flat_key_names_its_new_place(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config([override])
    message = str(err.value)
    assert message.startswith(expected) and "\n" not in message, message


def test_a_moved_key_in_a_recipe_file_names_its_new_place_and_the_file(tmp_path):
    recipe = tmp_path / "old_style.yaml"
    recipe.write_text("data:\n  prompts: [a cat]\nmodel:\n  cfg_interval: [0.4, 1.0]\n")
    with pytest.raises(ConfigError, match=r"^model.cfg_interval moved: set model.adapter_options.cfg_interval "
                                          r"\(BagelForConditionalGeneration's option\) \[recipe file old_style.yaml\]$"):
        load_config([f"recipe={recipe}"])


def test_every_moved_key_points_at_an_option_a_registered_component_declares():
    load_plugins(())
    declared: dict[str, set[str]] = {"reward.worker_options": {f.name for f in dataclasses.fields(RewardWorkerOptions)}}
    for block in OPTION_BLOCKS:
        for name in block.registry.names():
            options = block.options_class(block.registry.get(name))
            declared.setdefault(block.block, set()).update(f.name for f in dataclasses.fields(options))
    for name in MODEL_FAMILIES.names():  # algo.family_options, and the think_draw plan loss's block
        options = MODEL_FAMILIES.get(name).Options
        declared.setdefault("algo.family_options", set()).update(f.name for f in dataclasses.fields(options))
        sampling = MODEL_FAMILIES.get(name).Sampling  # rollout.sampling_options
        declared.setdefault("rollout.sampling_options", set()).update(f.name for f in dataclasses.fields(sampling))
    declared["algo.family_options.plan_loss_options"] = {
        f.name for loss in TOKEN_LOSSES.names() for f in dataclasses.fields(TOKEN_LOSSES.get(loss).Options)}
    declared["algo.rollout_correction_options"] = {f.name for f in dataclasses.fields(RolloutCorrectionConfig)}
    declared["rollout.sampling_options.sde_window_options"] = {f.name for f in dataclasses.fields(SdeWindowOptions)}
    declared["trainer.logger_options"] = {f.name for f in dataclasses.fields(LoggerOptions)}
    losses = set(DIFFUSION_LOSSES.names()) | set(TOKEN_LOSSES.names()) | set(FORWARD_LOSSES.names())
    for old, (new, _) in MOVED_KEYS.items():
        block, option = new.rsplit(".", 1)
        head, _, loss = block.rpartition(".")
        if head == "algo.policy_loss_options" and loss in losses:  # a block named for one loss: its own options
            assert option in {f.name for f in dataclasses.fields(loss_options_class(loss))}, f"{old} -> {new}"
            continue
        assert option in declared.get(block, set()), f"{old} -> {new}: no component declares it"


@pytest.mark.parametrize("overrides, expected", [
    ([LTX2, "model.adapter_options.stg_scle=1"], "model.adapter_options.stg_scle=1: model adapter LTX2Pipeline has no option 'stg_scle'; "
                                         "its options: audio_guidance_rescale"),
    ([LTX2, "model.adapter_options.stg_scale=big"], "model.adapter_options.stg_scale='big': expected float (model adapter LTX2Pipeline)"),
    (["model.adapter_options.stg_scale=1"], "model.adapter_options.stg_scale=1: model adapter StableDiffusion3Pipeline has no option "
                                    "'stg_scale'; its options: max_sequence_length"),
    (["recipe=tiny_wan22_flowgrpo", "model.adapter_options.guidance_scale_2=0.5"], "model.adapter_options.guidance_scale_2=0.5: expected"),
    (["rollout.backend_options.max_wait_ms=-1"], "rollout.backend_options.max_wait_ms=-1.0: expected >= 0"),
    (["rollout.backend_options.python=/usr/bin/python3"], "rollout.backend_options.python='/usr/bin/python3': rollout backend native "
                                                  "has no option 'python'"),
    (["rollout.backend=server", "rollout.backend_options.server_timeout_s=0"], "rollout.backend_options.server_timeout_s=0.0: expected > 0"),
    (["trainer.backend=ray", "trainer.backend_options.nnodes=0"], "trainer.backend_options.nnodes=0: expected an integer >= 1"),
    (["trainer.engine_options.param_offload=true"], "trainer.engine_options.param_offload=True: training engine local "
                                                   "has no option 'param_offload'"),
    (["trainer.pipeline=async", "trainer.pipeline_options.stale_policy=skip"],
     "trainer.pipeline_options.stale_policy='skip': expected one of drop"),
    (["reward.worker_options.num_gpus=-1"], "reward.worker_options.num_gpus=-1.0: expected >= 0"),
    (["reward.worker_options.count=2"], "reward.worker_options.count=2: reward workers on Ray has no option 'count'"),
])
def test_a_bad_option_fails_at_load_with_one_line_naming_it(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    message = str(err.value)
    assert message.startswith(expected) and "\n" not in message, message


def test_the_bound_options_are_what_the_recipe_sets():
    cfg = load_config(["rollout.backend=server", "rollout.backend_options.max_wait_ms=7", "rollout.backend_options.server_timeout_s=9"])
    options = cfg.rollout.backend_options
    assert (options.max_wait_ms, options.server_timeout_s, options.python) == (7.0, 9.0, None)
    cfg = load_config(["trainer.backend=ray", "trainer.backend_options.devices_per_node=2", "trainer.micro_batch_size=8",
                       "trainer.engine_options.optimizer_offload=true"])
    assert cfg.trainer.engine == "fsdp2"  # the backend's default engine, filled at load
    assert cfg.trainer.backend_options.world_size == 2
    assert cfg.trainer.engine_options.optimizer_offload and not cfg.trainer.engine_options.param_offload
    cfg = load_config(["reward.worker_options.num_workers=2", "reward.worker_options.num_cpus=0.5"])
    assert cfg.reward.worker_options == RewardWorkerOptions(num_workers=2, num_cpus=0.5, num_gpus=0.0)


def test_rollout_backends_declare_what_they_can_do():
    assert ROLLOUT_BACKENDS.get("native").shares_model and not ROLLOUT_BACKENDS.get("server").shares_model
    assert ROLLOUT_BACKENDS.get("vllm").loads_own_weights and ROLLOUT_BACKENDS.get("vllm_omni").loads_own_weights
    assert not ROLLOUT_BACKENDS.get("native").loads_own_weights
    cfg = load_config(["recipe=tiny_qwen3_grpo", "rollout.backend=vllm"])
    assert "rollout.backend_options.python" in beside_trainer_problem(cfg) and not shares_model(cfg)
    cfg = load_config(["recipe=tiny_qwen3_grpo", "rollout.backend=vllm", "rollout.backend_options.python=/opt/vllm-omni/bin/python"])
    assert beside_trainer_problem(cfg) is None


def _release(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string: "0.1.0" -> (0, 1, 0), "0.3.0rc1" -> (0, 3, 0)."""
    import re
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    assert match, f"not a version: {version!r}"
    return tuple(int(part or 0) for part in match.groups())


def test_moved_keys_are_dropped_in_their_stated_release():
    # The table of moved keys has an end: in the release MOVED_KEYS_REMOVED_IN it goes (old
    # recipes then get the schema's unknown-key error). Reaching that version with the table
    # still in place fails here: remove MOVED_KEYS (and this test), or move the date on purpose.
    assert _release("0.3.0rc1") == (0, 3, 0) and _release("0.10") == (0, 10, 0)
    assert _release(omni_rl.__version__) < _release(MOVED_KEYS_REMOVED_IN), (
        f"omni_rl {omni_rl.__version__} has reached MOVED_KEYS_REMOVED_IN={MOVED_KEYS_REMOVED_IN}: remove "
        f"MOVED_KEYS from omni_rl/config/loader.py ({len(MOVED_KEYS)} rows) and this test"
    )

"""The driver process in a plan (`omni_rl.plan.host`): a Ray driver's weightless build holds no
weights, the whole step's trajectories and decoded samples are on its host, and
`rollout.backend_options.trajectory_device=cpu` moves a local run's trajectories off the device peaks."""
import torch
from torch import nn

from omni_rl.compose import load_config
from omni_rl.plan.host import materialised_bytes
from omni_rl.plan.planner import make_plan

RECIPE = "tiny_sd3_flowgrpo"


def plan(tmp_path, *extra):
    return make_plan(load_config([f"recipe={RECIPE}", f"trainer.output_dir={tmp_path}", *extra]))


def test_a_ray_driver_holds_no_weights_and_the_whole_steps_samples(tmp_path):
    cfg = load_config([f"recipe={RECIPE}", f"trainer.output_dir={tmp_path}"])
    local = make_plan(cfg)
    ray = plan(tmp_path, "trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2")
    samples = cfg.trainer.prompts_per_step * cfg.trainer.samples_per_prompt
    r = cfg.rollout.sampling_options
    driver = ray["driver"]["bytes"]
    assert ray["driver"]["weightless_build"] and driver["policy_weights"] == 0
    # Every sample's trajectory: the device figure is the rank's share of the same per-sample bytes.
    per_sample = local["peaks"]["trajectories"] // samples
    assert driver["trajectories"] == samples * per_sample > 0
    assert ray["peaks"]["trajectories"] == -(-samples // 2) * per_sample
    assert driver["decoded_samples"] == samples * r.height * r.width * 3
    assert ray["driver"]["total"] == sum(driver.values())
    # A local driver is the rank: its weights and trajectories are the device's.
    assert local["driver"]["bytes"]["policy_weights"] == local["driver"]["bytes"]["trajectories"] == 0


def test_trajectories_on_the_host_leave_the_device_peaks(tmp_path):
    on_device = plan(tmp_path)
    on_host = plan(tmp_path, "rollout.backend_options.trajectory_device=cpu")
    moved = on_device["peaks"]["trajectories"]
    assert moved > 0 and on_host["peaks"]["trajectories"] == 0
    for peak in ("training", "rollout"):
        assert on_device["peaks"][peak] - on_host["peaks"][peak] == moved
    assert on_host["driver"]["trajectories_on_host"] and on_host["driver"]["bytes"]["trajectories"] == moved


def test_a_materialised_tensor_in_a_weightless_build_is_counted():
    with torch.device("meta"):
        module = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    assert materialised_bytes([module]) == 0
    module[1].register_buffer("table", torch.zeros(10, 3))  # what a build that allocates a table leaves
    module[0].rope = torch.zeros(5, dtype=torch.float16)  # a plain tensor attribute
    assert materialised_bytes([module, module]) == 10 * 3 * 4 + 5 * 2

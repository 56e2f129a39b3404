"""The worker group's pieces that need no Ray cluster: shards, pools, the config rules."""
import pytest

from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.workers import ResourcePool
from omni_rl.utils.shards import split_evenly

QWEN = ["recipe=tiny_qwen3_grpo"]


def test_split_evenly_covers_in_order():
    assert split_evenly(32, 2) == [(0, 16), (16, 32)]
    assert split_evenly(5, 3) == [(0, 2), (2, 4), (4, 5)]
    assert split_evenly(1, 2) == [(0, 1), (1, 1)]


def test_resource_pool_bundles():
    assert ResourcePool(2, 4).world_size == 8
    assert ResourcePool(1, 2).bundle() == {"CPU": 1.0}
    assert ResourcePool(1, 2, "GPU").actor_options() == {"num_cpus": 1, "num_gpus": 1}
    assert ResourcePool(1, 2, "NPU").bundle() == {"CPU": 1.0, "NPU": 1.0}
    with pytest.raises(ValueError, match="devices_per_node=0"):
        ResourcePool(1, 0)


def test_ray_config_is_accepted_with_whole_micro_batches_per_worker():
    cfg = load_config([*QWEN, "trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2",
                       "trainer.micro_batch_size=8"])
    assert cfg.trainer.backend_options.world_size == 2


@pytest.mark.parametrize("backend, engine", [("ray", "fsdp2"), ("local", "local")])
def test_the_engine_defaults_to_what_the_backend_drives(backend, engine):
    cfg = load_config([*QWEN, f"trainer.backend={backend}"])
    assert cfg.trainer.engine == engine


@pytest.mark.parametrize("overrides,key", [
    (["trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2"], "trainer.mini_batch_size"),
    (["trainer.backend=ray", "trainer.engine=local"], "trainer.engine"),
    (["trainer.engine=fsdp2"], "trainer.engine"),
    (["trainer.backend=mpi"], "trainer.backend"),
    (["trainer.backend_options.devices_per_node=2"], "trainer.backend_options.devices_per_node"),
    (["trainer.engine_options.param_offload=true"], "trainer.engine_options.param_offload"),
    (["trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.worker_timeout_s=0"], "trainer.backend_options.worker_timeout_s"),
])
def test_bad_distribution_settings_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config([*QWEN, *overrides])

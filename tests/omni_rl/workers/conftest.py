"""A local Ray for the worker tests: 2 CPUs, no dashboard, its temp folder short and removed."""
import shutil
import tempfile

import pytest

from omni_rl.workers.ray_cluster import init_local_ray


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    # Ray puts Unix sockets under its temp folder (107-character limit): a short path under /tmp.
    temp = tempfile.mkdtemp(prefix="ray_")
    init_local_ray(2, _temp_dir=temp, log_to_driver=False)  # the trainer's own start, workers at nice 0
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)

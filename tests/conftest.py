"""Session-wide test settings: tiny models are built into a temporary cache, never the home folder."""
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _tiny_model_cache(tmp_path_factory):
    if "OMNI_RL_CACHE" in os.environ and os.environ.get("OMNI_RL_TEST_KEEP_CACHE"):
        yield
        return
    old = os.environ.get("OMNI_RL_CACHE")
    os.environ["OMNI_RL_CACHE"] = str(tmp_path_factory.mktemp("omni_rl_cache"))
    yield
    if old is None:
        os.environ.pop("OMNI_RL_CACHE", None)
    else:
        os.environ["OMNI_RL_CACHE"] = old


# Tests marked `gpu` run on this device: cuda by default, npu on an Ascend machine, or cpu to
# dry-run their logic where no accelerator is (OMNI_RL_ACCEL_TEST_DEVICE=cpu pytest -m gpu).
ACCEL_DEVICE_ENV = "OMNI_RL_ACCEL_TEST_DEVICE"


def accel_test_device() -> str:
    return os.environ.get(ACCEL_DEVICE_ENV, "cuda")


def pytest_collection_modifyitems(config, items):
    from omni_rl.device import pick_device

    device = accel_test_device()
    try:
        pick_device(device)
        return
    except ValueError as err:
        reason = f"gpu test: {err} (set {ACCEL_DEVICE_ENV}=cpu to dry-run it here)"
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def accel_device() -> str:
    """The device name a `gpu` test runs on (see ACCEL_DEVICE_ENV)."""
    return accel_test_device()

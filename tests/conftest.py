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

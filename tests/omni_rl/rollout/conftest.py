"""Shared fixtures of the rollout tests: the tiny SD3, built once per session in a pytest tmp dir.

`tiny:sd3` is built into `$OMNI_RL_CACHE`; the variable points at a session tmp folder only while
the model is built (and is restored after), so the tests never write to the home folder. Every
adapter is then loaded from that folder through the same diffusers loading code as real weights.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch

from omni_rl.config.schema import ModelConfig
from omni_rl.models import build_model, resolve_model_path
from omni_rl.plugins import load_plugins


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the block, then put back what was there."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@pytest.fixture(scope="session")
def tiny_sd3_path(tmp_path_factory) -> Path:
    """The folder of the tiny random-weight SD3 (built once per session)."""
    session_cache = os.environ.get("OMNI_RL_CACHE")
    if session_cache and tmp_path_factory.getbasetemp() in Path(session_cache).parents:
        cache = Path(session_cache)  # a session tmp cache already set up (tests/conftest.py)
    else:
        cache = tmp_path_factory.mktemp("omni_rl_cache")
    load_plugins()  # registers the `sd3` tiny-model builder (adapters/sd3.py)
    with _env("OMNI_RL_CACHE", str(cache)):
        folder = Path(resolve_model_path("tiny:sd3"))
    assert cache in folder.parents, f"tiny model was built outside the tmp cache: {folder}"
    return folder


@pytest.fixture(scope="session")
def make_sd3(tiny_sd3_path) -> Callable[[], object]:
    """A factory of fresh, independent tiny SD3 adapters (for tests that change weights)."""

    def make():
        return build_model(ModelConfig(path=str(tiny_sd3_path)), torch.device("cpu"))

    return make


@pytest.fixture(scope="session")
def tiny_sd3(make_sd3):
    """One shared tiny SD3 adapter. Tests must not change its weights: use `make_sd3` for that."""
    return make_sd3()


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Run the rollout tests on one intra-op thread, then put the setting back.

    The tiny model's ops are far too small to gain from threads, and on a busy CI machine each
    parallel region waits for its descheduled threads: measured here, one tiny-SD3 forward took
    ~7 ms on one thread and 200-600 ms on two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)

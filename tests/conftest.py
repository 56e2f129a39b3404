"""Session-wide test settings: tiny models are built into a temporary cache, never the home folder;
the summary names the CPU the suite ran on (results differ by CPU model: BLAS and FFT kernels)."""
import contextlib
import os
import socket
import threading
import time

import pytest

# The project's wait policy (omni_rl/__init__.py) for the test processes too: they import torch
# before omni_rl, and OpenMP reads the policy once, when torch loads it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_configure(config):
    """Under pytest-xdist each worker process gets its share of the cores as torch threads, so
    the workers together use the machine once over instead of each spinning a full OpenMP team
    against the others (`addopts` runs `-n logical`: one worker per logical CPU, up to 4)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 0:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # subprocesses a test starts inherit it
        import torch

        torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def _tiny_model_cache(tmp_path_factory):
    if "OMNI_RL_CACHE" in os.environ and os.environ.get("OMNI_RL_TEST_KEEP_CACHE"):
        yield
        return
    old = os.environ.get("OMNI_RL_CACHE")
    # One cache for the whole run: xdist workers share the base folder's parent (the tiny cache
    # builds each model once under a lock, whichever worker asks first).
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    cache = root / "omni_rl_cache"
    cache.mkdir(exist_ok=True)
    os.environ["OMNI_RL_CACHE"] = str(cache)
    yield
    if old is None:
        os.environ.pop("OMNI_RL_CACHE", None)
    else:
        os.environ["OMNI_RL_CACHE"] = old


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it, or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"ran on: {cpu_model()}, {os.cpu_count()} logical CPUs")


# Tests marked `gpu` run on this device: cuda by default, npu on an Ascend machine, or cpu to
# dry-run their logic where no accelerator is (OMNI_RL_ACCEL_TEST_DEVICE=cpu pytest -m gpu).
ACCEL_DEVICE_ENV = "OMNI_RL_ACCEL_TEST_DEVICE"


def accel_test_device() -> str:
    return os.environ.get(ACCEL_DEVICE_ENV, "cuda")


# The modules that take longest (whole learning runs, real-size plans, Ray and subprocess runs)
# are collected first. pytest-xdist (`--dist loadfile`) hands out modules in collection order, so
# both workers start on the long ones and end together on short ones, instead of one worker
# running a two-minute module alone at the end.
LONGEST_FIRST = (
    "tests/test_demo.py", "tests/recipes/", "tests/omni_rl/plan/", "tests/benchmarks/", "tests/omni_rl/workers/",
    "tests/omni_rl/rollout/", "tests/adapters/",
)


def longest_first(items) -> None:
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: each module keeps its own order


def pytest_collection_modifyitems(config, items):
    longest_first(items)
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


def _trickling_server(interval_s=0.5, max_s=60.0):
    """A server on 127.0.0.1 that answers each connection with one byte every `interval_s` (a
    header line that never ends). Its thread stops when the client hangs up, after `max_s`, or
    when the block ends; the block gets (url, connections accepted so far)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop, accepted = threading.Event(), []

    def serve():
        end = time.monotonic() + max_s
        while not stop.is_set() and time.monotonic() < end:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(1)
            with conn:
                try:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                    while not stop.wait(interval_s) and time.monotonic() < end:
                        conn.sendall(b"a")
                except OSError:  # the client hung up
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join(10)
        listener.close()
        assert not thread.is_alive()


@pytest.fixture
def trickling_server():
    """`with trickling_server(interval_s, max_s) as (url, accepted):` a server that never finishes
    its answer (the HTTP client's deadline tests)."""
    return contextlib.contextmanager(_trickling_server)

"""Session-wide test settings: tiny models are built into a temporary cache, never the home folder;
the summary names the CPU the suite ran on (results differ by CPU model: BLAS and FFT kernels)."""
import contextlib
import os
import socket
import threading
import time

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


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the budget's `long` marks must count
def pytest_collection_modifyitems(config, items):
    mark_budget_long(items)
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


# The default run's time budget (CI: 30 minutes on a loaded 2-core machine). These tests are
# marked `long` at collection (so `python -m pytest -m long` still runs them):
# - the newest adapters' test modules, except the checks that pin them to their pipeline (noise-0
#   equals the pipeline, the trainer replays the rollout's log-probs) and their refusals, which
#   stay in the default run with each model's few-step recipe run;
# - real recipes whose plan traces the same network at the same shapes as another real recipe in
#   the default run (only the rewards differ).
BUDGET_LONG_MODULES = (
    "tests/adapters/test_flux_adapter.py", "tests/adapters/test_flux_kontext_adapter.py",
    "tests/adapters/test_z_image_adapter.py", "tests/adapters/test_flux2_adapter.py",
    "tests/adapters/test_hunyuan_video15_adapter.py",
)
BUDGET_KEEP = ("noise_zero", "replays", "error", "refuse", "bad_", "nearest", "invalid")
BUDGET_LONG_PLANS = ("sd35_medium_flowgrpo_ocr_lora", "sd35_medium_flowgrpo_pickscore_lora", "qwen_image_flow_dppo_lora",
                     "flux1_dev_dancegrpo_hps_lora")


def mark_budget_long(items) -> None:
    for item in items:
        path = item.nodeid.split("::")[0]
        name = item.nodeid.split("::")[-1].lower()
        if path in BUDGET_LONG_MODULES and not any(k in name for k in BUDGET_KEEP):
            item.add_marker(pytest.mark.long)
        if "test_every_real_recipe_plans_without_weights" in name and any(f"[{r}]" in name for r in BUDGET_LONG_PLANS):
            item.add_marker(pytest.mark.long)

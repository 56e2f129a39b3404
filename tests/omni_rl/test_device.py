"""trainer.device names a device this machine has (omni_rl/device.py); the accelerators are
faked away (or in) with monkeypatch, so these hold on any machine."""
import pytest
import torch

from omni_rl import device as device_mod
from omni_rl.device import DeviceError, check_trainer_device, pick_device


@pytest.fixture
def no_accelerator(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device_mod, "npu_available", lambda: False)


def test_cuda_without_cuda_says_what_to_use(no_accelerator):
    with pytest.raises(DeviceError, match=r"^trainer.device='cuda' but no CUDA device is available here; use trainer.device=auto .* or trainer.device=cpu$"):
        pick_device("cuda")
    with pytest.raises(DeviceError, match="no NPU"):
        check_trainer_device("npu:0")
    assert pick_device("auto") == torch.device("cpu")
    assert isinstance(DeviceError("x"), ValueError)  # callers that catch ValueError still do


def test_a_device_index_past_the_last_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(DeviceError, match=r"trainer.device='cuda:2' but this machine has 2 CUDA device\(s\), cuda:0 to cuda:1"):
        pick_device("cuda:2")


def test_malformed_names(no_accelerator):
    for name in ("gpu", "cuda:x", "cuda:"):
        with pytest.raises(DeviceError, match=r"expected auto, cpu, cuda\[:N\] or npu\[:N\]"):
            pick_device(name)


def test_with_ray_the_driver_does_not_need_the_device(no_accelerator):
    check_trainer_device("cuda", backend="ray")  # a CPU head node drives GPU workers
    with pytest.raises(DeviceError):
        check_trainer_device("cuda", backend="local")

"""atomic_directory publishes files with the modes a plain open() / mkdir() would give under the
umask, whoever wrote them: safetensors' save_file (behind diffusers' and PEFT's LoRA exports)
creates 0o600 files, which other users of a shared output folder could not read."""
import os

import torch
from safetensors.torch import save_file

from omni_rl.utils.atomic import atomic_directory


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _mode(path) -> int:
    return path.stat().st_mode & 0o777


def test_files_in_an_atomic_directory_get_the_umask_modes(tmp_path):
    target = tmp_path / "lora"
    with atomic_directory(target) as tmp:
        save_file({"w": torch.ones(2)}, str(tmp / "pytorch_lora_weights.safetensors"))
        os.close(os.open(tmp / "private.txt", os.O_WRONLY | os.O_CREAT, 0o600))
        os.close(os.open(tmp / "tool.sh", os.O_WRONLY | os.O_CREAT, 0o700))
        (tmp / "nested").mkdir(mode=0o700)
        os.close(os.open(tmp / "nested" / "x.bin", os.O_WRONLY | os.O_CREAT, 0o600))

    umask = _umask()
    assert _mode(target) == 0o777 & ~umask
    assert _mode(target / "pytorch_lora_weights.safetensors") == 0o666 & ~umask
    assert _mode(target / "private.txt") == 0o666 & ~umask
    assert _mode(target / "tool.sh") == 0o777 & ~umask  # executables stay executable
    assert _mode(target / "nested") == 0o777 & ~umask
    assert _mode(target / "nested" / "x.bin") == 0o666 & ~umask

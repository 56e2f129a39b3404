"""A disk that fills up mid-run: one line naming the last good checkpoint, which still loads.

The disk is mocked, not the trainer: `os.fsync` (what reports a full disk for buffered writes)
starts failing with ENOSPC once step 2 is logged, so the checkpoint of step 2 is the write
that fails, wherever in the checkpoint code it happens.
"""
import errno
import os

from omni_rl.cli import main
from omni_rl.trainer.checkpoint import list_checkpoints, load_checkpoint
from tests.tiny_runs import TINY_QWEN3

FAST = TINY_QWEN3


def test_a_full_disk_during_a_save_is_one_line_and_the_last_checkpoint_survives(tmp_path, monkeypatch, capsys):
    out = tmp_path / "full"
    real_fsync = os.fsync

    def fsync(fd):
        metrics = out / "metrics.jsonl"
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code = main([*FAST, f"trainer.output_dir={out}", "trainer.total_steps=3", "trainer.save_every=1"])

    assert code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
    step1 = out / "checkpoints" / "step_000001"
    assert line == (f"error: no space left on device while writing the checkpoint of step 2 in {out / 'checkpoints'}; "
                    f"the last good checkpoint is {step1}"), line
    monkeypatch.undo()
    assert list_checkpoints(out) == [step1] and load_checkpoint(str(step1))["step"] == 1
    # The failed save left nothing that looks like a checkpoint, nor a temporary.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]


def test_a_full_disk_is_recognised_however_a_library_reports_it():
    from safetensors import SafetensorError

    from omni_rl.trainer.run_dir import DISK_FULL, write_failure

    enospc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    try:  # torch.save into a file object: the OSError, with torch's RuntimeError as its context
        try:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        except RuntimeError:
            raise enospc
    except OSError as err:
        assert write_failure(err) == DISK_FULL
    # What save_pretrained raises on a full tmpfs (safetensors writes from Rust).
    assert write_failure(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")) \
        == DISK_FULL
    assert write_failure(PermissionError(errno.EACCES, "Permission denied")) == "[Errno 13] Permission denied"
    assert write_failure(RuntimeError("a bug, not a disk")) is None

"""Metric sinks: jsonl round-trip and resume, TensorBoard files, wandb stand-in, fan-out."""
import json
import math
import sys
import types

import numpy as np
import pytest
import torch

from omni_rl.logging import (
    ConsoleSink,
    JsonlSink,
    MetricLogger,
    Sink,
    TensorBoardSink,
    WandbSink,
    build_sinks,
    check_metric_name,
    read_jsonl,
    scalar_value,
)


def test_scalar_value_converts_tensors_and_numpy():
    assert scalar_value("a", torch.tensor(1.5)) == 1.5
    assert scalar_value("a", torch.tensor([2.0])) == 2.0
    assert scalar_value("a", np.float32(0.25)) == 0.25
    assert scalar_value("a", np.int64(3)) == 3 and isinstance(scalar_value("a", np.int64(3)), int)
    assert scalar_value("a", True) == 1
    with pytest.raises(TypeError, match=r"metric 'loss/x'.*shape \(2,\)"):
        scalar_value("loss/x", torch.zeros(2))
    with pytest.raises(TypeError, match="loss/x"):
        scalar_value("loss/x", "1.0")


def test_jsonl_roundtrip(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log({"reward/total/mean": torch.tensor(0.5), "perf/samples": np.int64(8)}, step=1)
    sink.log({"loss/policy": -0.25, "loss/kl": float("nan"), "actor/grad_norm": math.inf}, step=2)
    # Flushed per line: readable before close.
    assert len(path.read_text().splitlines()) == 2
    sink.close()

    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"step": 1, "reward/total/mean": 0.5, "perf/samples": 8}
    # NaN and inf are not JSON: written as null.
    assert lines[1] == '{"step": 2, "loss/policy": -0.25, "loss/kl": null, "actor/grad_norm": null}'
    assert read_jsonl(path)[1]["loss/kl"] is None


def test_jsonl_reserved_step_key_and_bad_step(tmp_path):
    sink = JsonlSink(tmp_path / "m.jsonl")
    with pytest.raises(ValueError, match="reserved"):
        sink.log({"step": 1}, step=1)
    with pytest.raises(ValueError, match="non-negative int"):
        sink.log({"loss/policy": 1.0}, step=-1)
    sink.close()


def test_jsonl_resume_truncates_later_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    for step in range(1, 6):
        sink.log({"reward/total/mean": float(step)}, step)
    sink.close()

    resumed = JsonlSink(path, resume_from_step=3)
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]
    resumed.log({"reward/total/mean": 40.0}, 4)
    resumed.close()
    records = read_jsonl(path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[-1]["reward/total/mean"] == 40.0


def test_jsonl_append_without_resume_and_torn_tail(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss/policy": 1.0}\n{"step": 2, "loss/po')  # crash mid-line
    assert [r["step"] for r in read_jsonl(path)] == [1]  # readers skip the torn line

    sink = JsonlSink(path)  # drops the torn line so the next one starts clean
    sink.log({"loss/policy": 2.0}, 2)
    sink.close()
    assert path.read_text() == '{"step": 1, "loss/policy": 1.0}\n{"step": 2, "loss/policy": 2.0}\n'


def test_read_jsonl_bad_middle_line_names_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_jsonl(path)


def test_tensorboard_writes_event_file(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    sink.log({"reward/total/mean": 0.5, "loss/policy": torch.tensor(0.1)}, step=1)
    sink.add_image("val/gallery", np.zeros((8, 6, 3), dtype=np.uint8), step=1)
    with pytest.raises(ValueError, match="uint8"):
        sink.add_image("val/gallery", np.zeros((8, 6, 3), dtype=np.float32), step=1)
    sink.close()
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_wandb_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(ImportError, match=r"pip install omni-rl\[wandb\]"):
        WandbSink("proj", "run", {})


def test_wandb_sink_with_stand_in_module(monkeypatch, tmp_path):
    calls = []

    class FakeRun:
        def log(self, values, step):
            calls.append(("log", values, step))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    sink = WandbSink("proj", "run-1", {"lr": 1e-4}, dir=tmp_path)
    sink.log({"loss/policy": torch.tensor(0.5)}, step=3)
    sink.close()
    assert calls[0] == ("init", {"project": "proj", "name": "run-1", "config": {"lr": 1e-4}, "dir": str(tmp_path)})
    assert calls[1:] == [("log", {"loss/policy": 0.5}, 3), ("finish",)]


def test_console_sink_every_n_steps(capsys):
    sink = ConsoleSink(every=2)
    sink.log({"reward/total/mean": 0.51234, "loss/policy": -0.001, "perf/other": 1.0}, step=1)
    sink.log({"reward/total/mean": 0.51234, "loss/policy": -0.001, "perf/other": 1.0}, step=2)
    out = capsys.readouterr().out.splitlines()
    assert out == ["step 2 | reward=0.5123 loss=-0.001"]
    with pytest.raises(ValueError, match="every"):
        ConsoleSink(every=0)


def test_metric_name_namespace():
    check_metric_name("rollout_corr/kl")
    check_metric_name("val/reward/total/mean")
    for bad in ("epoch", "losses/policy", "loss/", "/x"):
        with pytest.raises(ValueError, match="namespace"):
            check_metric_name(bad)


def test_metric_logger_fans_out_and_checks_names(tmp_path):
    class Recorder(Sink):
        media = frozenset({"image"})

        def __init__(self):
            self.logged, self.images, self.closed = [], [], False

        def log(self, metrics, step):
            self.logged.append((dict(metrics), step))

        def add_image(self, tag, image, step):
            self.images.append((tag, step))

        def close(self):
            self.closed = True

    a, b = Recorder(), JsonlSink(tmp_path / "m.jsonl")
    with MetricLogger([a, b]) as logger:
        logger.log({"loss/policy": 1.0}, 7)
        logger.log_image("val/gallery", np.zeros((2, 2, 3), np.uint8), 7)  # JsonlSink has no images
        with pytest.raises(ValueError, match="namespace"):
            logger.log({"policy_loss": 1.0}, 8)
    assert a.logged == [({"loss/policy": 1.0}, 7)] and a.images == [("val/gallery", 7)] and a.closed
    assert read_jsonl(tmp_path / "m.jsonl") == [{"step": 7, "loss/policy": 1.0}]


def test_build_sinks_by_name(tmp_path):
    sinks = build_sinks(["console", "jsonl", "tensorboard"], tmp_path, resume_from_step=None)
    assert [type(s).__name__ for s in sinks] == ["ConsoleSink", "JsonlSink", "TensorBoardSink"]
    MetricLogger(sinks).close()
    assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "tensorboard").is_dir()

    with pytest.raises(ValueError, match="valid sinks: console, jsonl, tensorboard, wandb"):
        build_sinks(["jsonl", "mlflow"], tmp_path)
    with pytest.raises(ValueError, match="more than once"):
        build_sinks(["jsonl", "jsonl"], tmp_path)
    with pytest.raises(TypeError, match="list"):
        build_sinks("jsonl", tmp_path)


def test_a_sink_declares_the_media_it_takes():
    class Scalars:  # a sink by shape only: its media are not declared
        def log(self, metrics, step):
            pass

        def close(self):
            pass

    with pytest.raises(TypeError, match="is not an omni_rl.logging.Sink declaring media"):
        MetricLogger([Scalars()])

    class Films(Sink):
        media = frozenset({"films"})

    with pytest.raises(TypeError, match=r"declaring media within \['audio', 'image', 'video'\]"):
        MetricLogger([Films()])

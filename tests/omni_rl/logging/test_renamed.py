"""Tests for omni_rl.logging.renamed: names in the namespace move to the other one, metrics and
media alike, through a real MetricLogger (its name check accepts val_ema/); others pass as they are."""
import json

import numpy as np
import pytest

from omni_rl.logging.renamed import Renamed, rename, renamed
from omni_rl.logging.sinks import JsonlSink, MetricLogger, Sink


def test_renamed_moves_only_the_namespace():
    assert renamed("val/reward/total/mean", "val", "val_ema") == "val_ema/reward/total/mean"
    assert renamed("val/samples", "val", "val_ema") == "val_ema/samples"
    assert renamed("validation/x", "val", "val_ema") == "validation/x"  # a prefix of a word is no namespace
    assert renamed("reward/total/mean", "val", "val_ema") == "reward/total/mean"
    assert rename({"val/a": 1.0, "loss/b": 2.0}, "val", "val_ema") == {"val_ema/a": 1.0, "loss/b": 2.0}


class ImageSink(Sink):
    media = frozenset({"image"})

    def __init__(self):
        self.tags = []

    def log(self, metrics, step):
        pass

    def add_image(self, tag, image, step):
        self.tags.append((tag, step))

    def close(self):
        pass


def test_a_renamed_logger_writes_the_other_namespace(tmp_path):
    images = ImageSink()
    logger = MetricLogger([JsonlSink(tmp_path / "m.jsonl"), images])
    Renamed(logger, "val", "val_ema").log({"val/reward/total/mean": 0.5}, 3)
    Renamed(logger, "val", "val_ema").log_image("val/samples", np.zeros((2, 2, 3), np.uint8), 3)
    logger.close()
    assert json.loads((tmp_path / "m.jsonl").read_text()) == {"step": 3, "val_ema/reward/total/mean": 0.5}
    assert images.tags == [("val_ema/samples", 3)]
    with pytest.raises(ValueError, match="outside the metric namespace"):
        Renamed(logger, "val", "vall").log({"val/x": 1.0}, 0)

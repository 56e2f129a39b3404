"""Metric sinks, progress bar, sample galleries and reward curves.

`sinks` (the `MetricLogger` and its sinks, `LoggerOptions`, `METRIC_NAMESPACES`), `console`
(console logging and `train.log`), `gallery`, `video`, `curves` (`rise_report`), `val_records`
(`val_rise`), `renamed` (a logger seen through another namespace). TensorBoard, wandb, matplotlib
and PyAV are imported only when used, so importing this package is cheap.
"""
from omni_rl.logging.console import KNOWN_NOISE, attach_run_log, setup_console_logging
from omni_rl.logging.curves import metric_series, moving_average, plot_reward_curve, rise_report
from omni_rl.logging.gallery import make_grid, save_grid
from omni_rl.logging.val_records import read_val_records, val_rise, write_val_records
from omni_rl.logging.sinks import (
    METRIC_NAMESPACES,
    SINK_NAMES,
    ConsoleSink,
    LoggerOptions,
    JsonlSink,
    MetricLogger,
    ProgressBar,
    Sink,
    TensorBoardSink,
    WandbSink,
    build_sinks,
    check_metric_name,
    read_jsonl,
    scalar_value,
)
from omni_rl.logging.video import contact_sheet, gif_bytes, save_video, video_grid

__all__ = [
    "KNOWN_NOISE",
    "METRIC_NAMESPACES",
    "SINK_NAMES",
    "ConsoleSink",
    "JsonlSink",
    "MetricLogger",
    "ProgressBar",
    "Sink",
    "TensorBoardSink",
    "WandbSink",
    "attach_run_log",
    "LoggerOptions",
    "build_sinks",
    "check_metric_name",
    "contact_sheet",
    "gif_bytes",
    "make_grid",
    "metric_series",
    "moving_average",
    "plot_reward_curve",
    "read_jsonl",
    "read_val_records",
    "rise_report",
    "save_grid",
    "save_video",
    "scalar_value",
    "setup_console_logging",
    "val_rise",
    "video_grid",
    "write_val_records",
]

"""Metric sinks, progress bar, sample galleries and reward curves.

- `sinks`: `MetricLogger` fans `log(metrics, step)` out to `ConsoleSink`, `JsonlSink`,
  `TensorBoardSink`, `WandbSink`; `build_sinks(names, output_dir)` builds them by name;
  `ProgressBar` is the training-step bar; `LoggerOptions` (`trainer.logger_options`:
  progress_bar, wandb_project), bound at load. Metric names live in `METRIC_NAMESPACES`.
- `console`: `setup_console_logging()` (log records through the progress bar, known
  third-party noise left out, transformers' bars off) and `attach_run_log(output_dir)`
  (`OUTPUT/train.log`: every record at INFO and above, and the per-step lines).
- `gallery`: `make_grid` / `save_grid` tile sample images with captions.
- `video`: `save_video` writes an mp4 (H.264, optional AAC audio); `contact_sheet` /
  `video_grid` picture videos as rows of frames; `gif_bytes` for TensorBoard.
- `curves`: `plot_reward_curve` draws a run's reward; `rise_report` decides whether it rose.
- `val_records`: per-sample validation rows; `val_rise` pairs the first and last validation.
- `renamed`: `Renamed(logger, "val", "val_ema")`, a logger seen through another namespace.

TensorBoard, wandb, matplotlib and PyAV are imported only when used, so importing this package
is cheap.
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

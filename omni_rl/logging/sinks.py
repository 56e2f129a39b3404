"""Metric sinks and the fan-out logger the trainer writes to.

A sink subclasses `Sink`: `log(metrics, step)`, `close()`, and the media it also records
(`media`: `add_image` / `add_video` / `add_audio`): `ConsoleSink` (a compact line every N steps),
`JsonlSink` (a JSON object a line; a non-finite value is `null`), `TensorBoardSink` (scalars,
images, GIF videos, audio) and `WandbSink`. `MetricLogger` fans out to them and rejects a name
outside `METRIC_NAMESPACES` (`reward/*`, `loss/*`, `actor/*`, ...), so a typo cannot start a new
curve; docs/metrics.md lists the names. `ProgressBar` is the step bar (on a terminal only).

Left out on purpose: any distributed logic. Only the driver (rank 0) builds sinks.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from tqdm import tqdm

from omni_rl.logging.heldout_alarm import AlarmOptions
from omni_rl.option import option
from omni_rl.logging.console import metrics_logger
from omni_rl.logging.video import _check_fps, _check_sample_rate, _frames_array, _waveform_array, gif_bytes
from omni_rl.utils.atomic import atomic_write_text

METRIC_NAMESPACES = ("reward", "loss", "actor", "rollout_corr", "response", "perf", "timing", "val", "val_ema", "alarm",
                     "distill", "agent")


MEDIA = frozenset({"image", "video", "audio"})


class Sink:
    """What `MetricLogger` fans out to: `log` and `close`, and for each kind in `media` its
    `add_<kind>`: `add_image(tag, image, step)`, `add_video(tag, frames, fps, step)`,
    `add_audio(tag, waveform, sample_rate, step)` (TensorBoard has all three). `MetricLogger`
    hands a kind only to the sinks that declare it."""

    media: ClassVar[frozenset[str]] = frozenset()

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def add_image(self, tag: str, image: Any, step: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} declares no images (media={sorted(self.media)})")

    def add_video(self, tag: str, frames: Any, fps: float, step: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} declares no videos (media={sorted(self.media)})")

    def add_audio(self, tag: str, waveform: Any, sample_rate: int, step: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} declares no audio (media={sorted(self.media)})")


def check_metric_name(name: str) -> None:
    """Raise if `name` is not `NAMESPACE/...` with a namespace from `METRIC_NAMESPACES`."""
    head, sep, rest = name.partition("/") if isinstance(name, str) else ("", "", "")
    if not sep or not rest or head not in METRIC_NAMESPACES:
        raise ValueError(
            f"metric name {name!r} is outside the metric namespace; expected "
            f"'<namespace>/<name>' with namespace one of {', '.join(METRIC_NAMESPACES)} "
            f"(e.g. 'loss/policy')"
        )


def scalar_value(name: str, value: Any) -> int | float:
    """Turn a metric value into a Python int or float, or raise naming the metric."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):  # float and numpy floating scalars
        return float(value)
    # Tensors and numpy arrays: accept one element, whatever the rank ([] or [1]).
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    count = numel() if callable(numel) else numel
    if count == 1 and hasattr(value, "item"):
        item = value.item()
        if isinstance(item, (bool, numbers.Real)):
            return scalar_value(name, item)
    shape = tuple(getattr(value, "shape", ()))
    raise TypeError(
        f"metric {name!r} must be a scalar (int, float, numpy scalar or one-element tensor), "
        f"got {type(value).__name__}{' of shape ' + str(shape) if shape else ''}; "
        f"reduce it first (e.g. .mean())"
    )


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return int(step)


def _json_value(value: int | float) -> int | float | None:
    # JSON has no NaN/Infinity (json.dumps would write invalid tokens): store null instead.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a metrics.jsonl file written by `JsonlSink` into a list of records.

    A torn last line (the process died while writing it) is skipped; a bad line anywhere
    else raises, naming the line.
    """
    return [record for _line, record in _read_lines(Path(path))]


def _read_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(raw line, parsed record) for each complete line of a metrics.jsonl file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    parsed = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if index == len(lines) - 1:
                break  # torn last line from a crash mid-write: it never was a whole record
            raise ValueError(
                f"{path}:{index + 1} is not valid JSON ({err}); fix or delete that line"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(
                f"{path}:{index + 1} has no integer 'step' field; is this a metrics.jsonl file?"
            )
        parsed.append((line, record))
    return parsed


class JsonlSink(Sink):
    """Append `{"step": step, **metrics}` as one JSON line per `log` call, flushed each line.

    `resume_from_step=k` rewrites the file (atomically) keeping the lines with `step <= k`; without
    it an existing file is appended to. A torn last line left by a crash is dropped first.
    """

    def __init__(self, path: str | os.PathLike, resume_from_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._rewrite_existing(resume_from_step)
        self._file = open(self.path, "a", encoding="utf-8")

    def _rewrite_existing(self, resume_from_step: int | None) -> None:
        text = self.path.read_text(encoding="utf-8")
        torn_tail = bool(text) and not text.endswith("\n")
        if resume_from_step is None and not torn_tail:
            return
        keep_until = None if resume_from_step is None else _check_step(resume_from_step)
        kept = [
            line
            for line, record in _read_lines(self.path)
            if keep_until is None or record["step"] <= keep_until
        ]
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        record: dict[str, Any] = {"step": _check_step(step)}
        for name, value in metrics.items():
            if name == "step":
                raise ValueError("'step' is reserved in metrics.jsonl; pass the step as the `step` argument")
            record[name] = _json_value(scalar_value(name, value))
        # allow_nan=False: a non-finite value that slipped through must fail loudly, not
        # write a token that no JSON reader accepts.
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class TensorBoardSink(Sink):
    """`SummaryWriter.add_scalar` per metric; `add_image` for sample galleries.

    `resume_from_step=k` purges events after step k (TensorBoard's `purge_step`), the
    counterpart of `JsonlSink`'s truncation.
    """

    media = MEDIA

    def __init__(self, log_dir: str | os.PathLike, resume_from_step: int | None = None):
        # Imported here: torch.utils.tensorboard takes seconds to import, and runs that do
        # not ask for TensorBoard should not pay for it.
        from torch.utils.tensorboard import SummaryWriter

        purge_step = None if resume_from_step is None else _check_step(resume_from_step) + 1
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        step = _check_step(step)
        for name, value in metrics.items():
            self._writer.add_scalar(name, scalar_value(name, value), global_step=step)

    def add_image(self, tag: str, image: Any, step: int) -> None:
        """Log one uint8 image laid out [H, W, C] (C = 1, 3 or 4): a numpy array or tensor."""
        shape = tuple(getattr(image, "shape", ()))
        dtype = str(getattr(image, "dtype", type(image).__name__))
        if len(shape) != 3 or shape[-1] not in (1, 3, 4) or not dtype.endswith("uint8"):
            raise ValueError(
                f"add_image({tag!r}) expects a uint8 array shaped [H, W, C] with C in 1, 3, 4, "
                f"got dtype {dtype} shape {shape}; for a PIL image pass numpy.asarray(image)"
            )
        self._writer.add_image(tag, image, global_step=_check_step(step), dataformats="HWC")

    def add_video(self, tag: str, frames: Any, fps: float, step: int) -> None:
        """Log uint8 frames [T, H, W, 3] as an animated GIF, which the image tab plays.

        PIL makes the GIF (`video.gif_bytes`), where `SummaryWriter.add_video` would need moviepy.
        """
        from tensorboard.compat.proto.summary_pb2 import Summary

        step = _check_step(step)
        array = _frames_array(frames, f"add_video({tag!r})")
        _check_fps(fps, f"add_video({tag!r})")
        _, height, width, channels = array.shape
        image = Summary.Image(
            height=height, width=width, colorspace=channels, encoded_image_string=gif_bytes(array, fps)
        )
        summary = Summary(value=[Summary.Value(tag=tag, image=image)])
        # The writer's own route for every summary it makes (add_image, add_video use it too).
        self._writer._get_file_writer().add_summary(summary, global_step=step)

    def add_audio(self, tag: str, waveform: Any, sample_rate: int, step: int) -> None:
        """Log a float waveform [channels, samples] or [samples] in [-1, 1] for the audio tab.

        TensorBoard's audio summary is mono: a stereo waveform is mixed down (the mean of its
        channels)."""
        what = f"add_audio({tag!r})"
        step = _check_step(step)
        sample_rate = _check_sample_rate(sample_rate, what)
        mono = _waveform_array(waveform, what).mean(axis=0)
        self._writer.add_audio(tag, mono, global_step=step, sample_rate=sample_rate)

    def close(self) -> None:
        self._writer.close()


class WandbSink(Sink):
    """Log to Weights & Biases. wandb is an optional extra, imported only when this is built."""

    def __init__(
        self,
        project: str,
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        dir: str | os.PathLike | None = None,
    ):
        try:
            import wandb
        except ImportError:
            raise ImportError(
                "the 'wandb' sink needs the wandb package, which is not installed; "
                "run `pip install omni-rl[wandb]`, or drop 'wandb' from the logger sinks"
            ) from None
        self._run = wandb.init(
            project=project,
            name=run_name,
            config=dict(config) if config is not None else None,
            dir=str(dir) if dir is not None else None,
        )

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        values = {name: scalar_value(name, value) for name, value in metrics.items()}
        self._run.log(values, step=_check_step(step))

    def close(self) -> None:
        self._run.finish()


# Shown by ConsoleSink and ProgressBar when present, in this order, under a short label.
DEFAULT_CONSOLE_KEYS: dict[str, str] = {
    "reward": "reward/total/mean",
    "loss": "loss/policy",
    "kl": "loss/kl",
    "val_reward": "val/reward/total/mean",
    "step_s": "timing/step",
}


def _format_value(value: int | float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def _short_metrics(metrics: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, str]:
    return {
        label: _format_value(scalar_value(name, metrics[name]))
        for label, name in keys.items()
        if name in metrics
    }


class ConsoleSink(Sink):
    """Print `step 10 | reward=0.512 loss=-0.0012 kl=0.003` every `every` steps.

    `keys` maps a short label to a metric name (default `DEFAULT_CONSOLE_KEYS`). Written with
    `tqdm.write` (a live bar is redrawn below it) and copied to the run log when one is attached.
    """

    def __init__(self, every: int = 1, keys: Mapping[str, str] | None = None, file: Any = None):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"ConsoleSink every must be an int >= 1 (print every N steps), got {every!r}")
        self.every = every
        self.keys = dict(DEFAULT_CONSOLE_KEYS if keys is None else keys)
        self.file = file

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if _check_step(step) % self.every:
            return
        parts = " ".join(f"{label}={text}" for label, text in _short_metrics(metrics, self.keys).items())
        line = f"step {step} | {parts}" if parts else f"step {step}"
        stream = self.file if self.file is not None else sys.stdout
        tqdm.write(line, file=stream)
        # Flushed: a buffered stdout would otherwise reach a shared pipe or file after the
        # stderr lines written since, out of order.
        stream.flush()
        metrics_logger().info(line)  # into train.log when a run log is attached

    def close(self) -> None:
        pass


class MetricLogger:
    """Fan one `log(metrics, step)` out to every sink, after checking the metric names."""

    def __init__(self, sinks: Iterable[Sink]):
        self.sinks = list(sinks)
        for sink in self.sinks:
            if not isinstance(sink, Sink) or not sink.media <= MEDIA:
                raise TypeError(f"{sink!r} is not an omni_rl.logging.Sink declaring media within {sorted(MEDIA)}; "
                                f"subclass Sink and set `media` to the kinds its add_<kind> methods record")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for name in metrics:
            check_metric_name(name)
        for sink in self.sinks:
            sink.log(metrics, step)

    def log_image(self, tag: str, image: Any, step: int) -> None:
        """Send a uint8 [H, W, C] image to the sinks that take images (TensorBoard)."""
        for sink in self.sinks:
            if "image" in sink.media:
                sink.add_image(tag, image, step)

    def log_video(self, tag: str, frames: Any, fps: float, step: int) -> None:
        """Send uint8 frames [T, H, W, 3] to the sinks that take videos (TensorBoard)."""
        for sink in self.sinks:
            if "video" in sink.media:
                sink.add_video(tag, frames, fps, step)

    def log_audio(self, tag: str, waveform: Any, sample_rate: int, step: int) -> None:
        """Send a float waveform [channels, samples] in [-1, 1] to the sinks that take audio."""
        for sink in self.sinks:
            if "audio" in sink.media:
                sink.add_audio(tag, waveform, sample_rate, step)

    def close(self) -> None:
        """Close every sink, even if one fails; the first failure is raised afterwards."""
        first_error: BaseException | None = None
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as err:  # noqa: BLE001 - keep closing the others
                first_error = first_error or err
        if first_error is not None:
            raise first_error

    def __enter__(self) -> "MetricLogger":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


SINK_NAMES = ("console", "jsonl", "tensorboard", "wandb")


@dataclass
class LoggerOptions(AlarmOptions):
    """The sinks', the progress bar's and the held-out alarm's options (`trainer.logger_options`)."""

    progress_bar: bool = option(True, "Show the training-step bar on the console (off for logs written to files).")
    wandb_project: str = option("omni-rl", "The wandb project of the `wandb` sink's runs.")




def build_sinks(
    names: Sequence[str],
    output_dir: str | os.PathLike,
    *,
    project: str = "omni-rl",
    run_name: str | None = None,
    config: Mapping[str, Any] | None = None,
    console_every: int = 1,
    resume_from_step: int | None = None,
) -> list[Sink]:
    """Build sinks by name, their files under `output_dir`.

    `jsonl` (metrics.jsonl), `tensorboard` (tensorboard/), `wandb` (project `project`, run
    `run_name`, default the folder's name) and `console` (every `console_every` steps);
    `resume_from_step` keeps a resumed run from repeating steps.
    """
    if isinstance(names, str):
        raise TypeError(
            f"build_sinks expects a list of sink names, got the string {names!r}; wrap it: [{names!r}]"
        )
    unknown = [name for name in names if name not in SINK_NAMES]
    if unknown:
        raise ValueError(f"unknown metric sink(s) {unknown}; valid sinks: {', '.join(SINK_NAMES)}")
    duplicates = sorted({name for name in names if list(names).count(name) > 1})
    if duplicates:
        raise ValueError(
            f"metric sink(s) {duplicates} listed more than once in {list(names)}; list each once"
        )

    output_dir = Path(output_dir)
    sinks: list[Sink] = []
    for name in names:
        if name == "console":
            sinks.append(ConsoleSink(every=console_every))
        elif name == "jsonl":
            sinks.append(JsonlSink(output_dir / "metrics.jsonl", resume_from_step=resume_from_step))
        elif name == "tensorboard":
            sinks.append(TensorBoardSink(output_dir / "tensorboard", resume_from_step=resume_from_step))
        elif name == "wandb":
            sinks.append(WandbSink(project, run_name or output_dir.resolve().name, config, dir=output_dir))
    return sinks


class ProgressBar:
    """A tqdm bar over training steps whose postfix shows `reward`, `loss` and `kl`.

    `update(step, metrics)` moves it to `step` completed steps. With `file=None` it draws only when
    stderr is a terminal (in a pipe or CI log its redraws would garble the lines; the console lines
    are the progress there).
    """

    POSTFIX_KEYS = {"reward": "reward/total/mean", "loss": "loss/policy", "kl": "loss/kl"}

    def __init__(
        self,
        total: int | None,
        initial: int = 0,
        desc: str = "train",
        disable: bool = False,
        file: Any = None,
    ):
        self._bar = tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit="step",
            # None: off unless the stream is a terminal; given a file, draw on it regardless.
            disable=True if disable else (None if file is None else False),
            file=file,  # None: tqdm's default, stderr
            dynamic_ncols=True,
        )

        self._step = initial
        self._postfix: dict[str, str] = {}

    @property
    def n(self) -> int:
        """Completed steps shown (tracked here: a disabled tqdm bar does not count)."""
        return self._step

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        step = _check_step(step)
        if metrics:
            # Merge, so a metric logged only every few steps (kl) stays visible in between.
            self._postfix.update(_short_metrics(metrics, self.POSTFIX_KEYS))
            self._bar.set_postfix(self._postfix, refresh=False)
        # Absolute position, not a delta: a skipped or repeated call cannot make the bar drift.
        self._bar.update(step - self._step)
        self._step = step

    def close(self) -> None:
        self._bar.close()

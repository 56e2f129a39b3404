"""What a run shows on the console, and the full log it keeps in its output folder.

`setup_console_logging()` sends records to stderr through `tqdm.write`, keeps known-harmless
third-party messages (`KNOWN_NOISE`) off the console and routes transformers' and diffusers'
records through the same handler; `attach_run_log(output_dir)` writes everything at INFO and
above to `OUTPUT/train.log`. Left out: Ray workers' own logs.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from tqdm import tqdm

CONSOLE_FORMAT = "%(levelname)s %(name)s: %(message)s"
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
RUN_LOG_NAME = "train.log"
# The logger the console sink copies its metric lines to: it does not propagate (the lines are
# on the console already), and a run log listens to it as well as to the root logger.
METRICS_LOGGER = "omni_rl.metrics"
PROGRESS_BARS_ENV = "HF_HUB_DISABLE_PROGRESS_BARS"


@dataclass(frozen=True)
class Noise:
    """A message that is expected and harmless: records of `logger` whose message matches."""

    logger: str
    message: re.Pattern
    why: str


# A diffusers pipeline saved without an optional component (the tiny SD3 has no T5 encoder):
# it says it cannot save None. A component that is not None and cannot be saved is news: shown.
_NONE_CANNOT_BE_SAVED = re.compile(r"self\.\w+=None of type <class 'NoneType'> cannot be saved\.")
KNOWN_NOISE: tuple[Noise, ...] = (
    Noise("diffusers.pipelines.pipeline_utils", _NONE_CANNOT_BE_SAVED, "optional component absent"),
    Noise("diffusers.modular_pipelines.modular_pipeline", _NONE_CANNOT_BE_SAVED, "optional component absent"),
)


class KnownNoiseFilter(logging.Filter):
    """Refuses the records of `KNOWN_NOISE` (put on console handlers, not on the run log)."""

    def __init__(self, noise: tuple[Noise, ...] = KNOWN_NOISE):
        super().__init__()
        self.noise = noise

    def filter(self, record: logging.LogRecord) -> bool:
        for noise in self.noise:
            if record.name == noise.logger and noise.message.fullmatch(record.getMessage()):
                return False
        return True


class ConsoleLogHandler(logging.Handler):
    """Writes records with `tqdm.write` (clearing and redrawing live bars), then flushes.

    `stream=None` is whatever `sys.stderr` is when a record comes, as `logging.lastResort` does.
    """

    def __init__(self, stream: Any = None, level: int = logging.NOTSET):
        super().__init__(level)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = self.stream if self.stream is not None else sys.stderr
            tqdm.write(self.format(record), file=stream)
            stream.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - logging must never break the run
            self.handleError(record)


def setup_console_logging(level: int = logging.INFO) -> Optional[ConsoleLogHandler]:
    """The console of a run (see the module docstring); returns the handler it installed.

    Like `logging.basicConfig`, it does nothing (and returns None) when the root logger has
    handlers already.
    """
    root = logging.getLogger()
    if any(not isinstance(h, RunLogHandler) for h in root.handlers):
        return None
    handler = ConsoleLogHandler()
    handler.setFormatter(logging.Formatter(CONSOLE_FORMAT))
    handler.addFilter(KnownNoiseFilter())
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    os.environ.setdefault(PROGRESS_BARS_ENV, "1")  # a user's own setting (0: show them) wins
    for library in ("transformers", "diffusers"):
        when_imported(f"{library}.utils.logging", _route_library_logging)
    return handler


def _route_library_logging(library_logging: Any) -> None:
    """transformers' or diffusers' records to the root logger; their bars off if the env says so."""
    library_logging.disable_default_handler()
    library_logging.enable_propagation()
    if os.environ.get(PROGRESS_BARS_ENV, "").upper() in ("1", "ON", "YES", "TRUE"):
        library_logging.disable_progress_bar()


# --- the run log ----------------------------------------------------------------------------

class RunLogHandler(logging.FileHandler):
    """`OUTPUT/train.log`: every record at INFO and above; `close()` also detaches it."""

    def close(self) -> None:
        for name in ("", METRICS_LOGGER):
            logging.getLogger(name).removeHandler(self)
        global _run_log
        with _run_log_lock:
            if _run_log is self:
                _run_log = None
        super().close()


_run_log: Optional[RunLogHandler] = None
_run_log_lock = threading.Lock()


def attach_run_log(output_dir: str | os.PathLike) -> RunLogHandler:
    """Append every log record at INFO and above to `output_dir/train.log`, from now on.

    One run log per process (attaching another folder's closes the previous one); `handler.close()`
    detaches it.
    """
    global _run_log
    path = (Path(output_dir) / RUN_LOG_NAME).resolve()
    with _run_log_lock:
        previous = _run_log
        if previous is not None and Path(previous.baseFilename) == path and previous.stream is not None:
            return previous
    if previous is not None:
        previous.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = RunLogHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    root = logging.getLogger()
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    root.addHandler(handler)
    metrics_logger().addHandler(handler)
    with _run_log_lock:
        _run_log = handler
    return handler


def metrics_logger() -> logging.Logger:
    """The logger the console sink copies its lines to (only a run log listens to it)."""
    logger = logging.getLogger(METRICS_LOGGER)
    if logger.propagate:
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addHandler(logging.NullHandler())  # no "no handlers" fallback to stderr
    return logger


# --- a one-shot hook after a module's first import ---------------------------------------------

def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Call `callback(module)` once module `name` is imported: now if it is already, else right
    after its first import executes it. An error in the callback is logged, never raised into
    the import."""
    module = sys.modules.get(name)
    if module is not None:
        _run_callback(callback, module)
        return
    if not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))


def _run_callback(callback: Callable[[Any], None], module: Any) -> None:
    try:
        callback(module)
    except Exception as err:  # noqa: BLE001 - a logging tweak must not break an import
        logging.getLogger(__name__).warning("could not configure %s's logging: %s", module.__name__, err)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds module `name` as the path finder would and runs `callback` after it executes."""

    def __init__(self, name: str, callback: Callable[[Any], None]):
        self.name = name
        self.callback = callback
        self.done = False

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self.done:
            return None
        self.done = True  # stays in sys.meta_path, inert: removing it mid-import would skip a finder
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _CallbackLoader(spec.loader, self.callback)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader, callback: Callable[[Any], None]):
        self.loader = loader
        self.callback = callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        # The module keeps its real loader (resources, reloads); this wrapper only runs once.
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _run_callback(self.callback, module)

"""The console and the run log (omni_rl/logging/console.py), the bar's terminal-only drawing
and the console sink's flush. Process-wide setup (the root logger, transformers' and diffusers'
logging) is checked in a fresh subprocess; the rest in-process."""
import io
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

from tqdm import tqdm

from omni_rl.logging import ConsoleSink, ProgressBar, attach_run_log
from omni_rl.logging.console import ConsoleLogHandler, KnownNoiseFilter, when_imported

REPO_ROOT = Path(__file__).resolve().parents[3]


def record(name: str, message: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


def test_the_none_component_message_is_noise_and_a_real_one_is_news():
    noise = KnownNoiseFilter()
    name = "diffusers.pipelines.pipeline_utils"
    assert not noise.filter(record(name, "self.text_encoder_3=None of type <class 'NoneType'> cannot be saved."))
    assert noise.filter(record(name, "self.vae=MyVAE() of type <class 'my.MyVAE'> cannot be saved."))
    assert noise.filter(record("other", "self.text_encoder_3=None of type <class 'NoneType'> cannot be saved."))


def test_records_are_written_through_the_bar():
    stream = io.StringIO()
    bar = tqdm(total=3, file=stream, desc="train")
    handler = ConsoleLogHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.handle(record("omni_rl.x", "hello"))
    bar.close()
    text = stream.getvalue()
    before, after = text.split("WARNING omni_rl.x: hello\n")
    assert before.endswith("\r")  # the bar's line was cleared first: the record starts a line
    assert "train" in after  # and the bar is drawn again below it


def test_the_bar_draws_only_on_a_terminal(capsys):
    bar = ProgressBar(total=3)  # stderr, which pytest's capture makes a pipe
    bar.update(1, {"reward/total/mean": 0.5})
    bar.close()
    assert bar.n == 1
    assert capsys.readouterr().err == ""


class CountingStream(io.StringIO):
    flushes = 0

    def flush(self):
        self.flushes += 1
        super().flush()


def test_console_lines_are_flushed_at_once():
    stream = CountingStream()
    ConsoleSink(file=stream).log({"reward/total/mean": 0.25}, 1)
    assert stream.getvalue() == "step 1 | reward=0.25\n" and stream.flushes >= 1


def test_the_run_log_takes_info_and_up_and_the_console_lines(tmp_path):
    handler = attach_run_log(tmp_path / "a")
    try:
        assert attach_run_log(tmp_path / "a") is handler  # the same folder: the same file
        log = logging.getLogger("omni_rl.test_run_log")
        log.setLevel(logging.DEBUG)
        log.debug("not kept")
        log.info("kept at info")
        logging.getLogger("some.library").warning("a warning")
        ConsoleSink(file=io.StringIO()).log({"loss/policy": 0.5}, 3)
        other = attach_run_log(tmp_path / "b")  # another run in this process: the first is closed
        log.info("for b")
    finally:
        logging.getLogger("omni_rl.test_run_log").setLevel(logging.NOTSET)
        attach_run_log(tmp_path / "b").close()
    a = (tmp_path / "a" / "train.log").read_text()
    assert "INFO omni_rl.test_run_log: kept at info" in a and "not kept" not in a
    assert "WARNING some.library: a warning" in a
    assert "INFO omni_rl.metrics: step 3 | loss=0.5" in a
    assert "for b" not in a and "for b" in (tmp_path / "b" / "train.log").read_text()
    assert other not in logging.getLogger().handlers  # close() detached it
    logging.getLogger("omni_rl.test_run_log").info("after close")
    assert "after close" not in (tmp_path / "b" / "train.log").read_text()


def test_a_callback_runs_after_a_module_is_first_imported(tmp_path, monkeypatch):
    (tmp_path / "omni_rl_hooked_module.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("omni_rl_hooked_module", lambda module: seen.append(module.VALUE + 1))
    assert seen == []
    import omni_rl_hooked_module

    assert seen == [42]
    assert type(omni_rl_hooked_module.__loader__).__name__ == "SourceFileLoader"  # its real loader
    when_imported("omni_rl_hooked_module", lambda module: seen.append(0))  # already imported: now
    assert seen == [42, 0]
    sys.modules.pop("omni_rl_hooked_module")


def test_workers_are_sent_the_progress_bar_setting():
    from omni_rl.workers.worker_group import FORWARDED_ENV

    assert "HF_HUB_DISABLE_PROGRESS_BARS" in FORWARDED_ENV


SCRIPT = textwrap.dedent("""
    import logging, sys
    from omni_rl.logging import attach_run_log, setup_console_logging
    assert setup_console_logging() is not None
    attach_run_log(sys.argv[1])
    from adapters.tiny.sd3 import build_tiny_sd3  # imports diffusers and transformers after the setup
    build_tiny_sd3(sys.argv[1] + "/model")
    import diffusers.utils.logging, transformers.utils.logging
    logging.getLogger("diffusers.pipelines.pipeline_utils").warning("news from diffusers")
    transformers.utils.logging.get_logger("transformers.modeling_utils").warning("news from transformers")
""")


def test_third_party_noise_is_silenced_on_the_console_and_kept_in_the_run_log(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "CI")}
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    console = result.stdout + result.stderr
    assert "cannot be saved" not in console, console
    assert "Writing model shards" not in console and "Loading weights" not in console, console
    # News still shows, once, in the console's format (their own handlers are gone).
    assert console.count("news from diffusers") == 1 and "WARNING diffusers.pipelines.pipeline_utils: news" in console
    assert console.count("news from transformers") == 1 and "WARNING transformers.modeling_utils: news" in console
    log = (tmp_path / "train.log").read_text()
    assert "self.text_encoder_3=None of type <class 'NoneType'> cannot be saved." in log
    assert "news from diffusers" in log and "news from transformers" in log

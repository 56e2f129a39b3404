"""What a user sees during a real run: `python main_omni.py recipe=tiny_qwen3_grpo` with the
progress bar on, once into a pipe (a log file, CI, `| tee`) and once on a terminal (a pty).

No line may hold a bar fragment and a metric line together, none of the silenced third-party
messages may show, and OUTPUT/train.log holds the records. The run log is attached the way the
trainer attaches it once the output folder is set up (`attach_run_log(output_dir)`), by a
launcher, before `omni_rl.cli.main` runs.
"""
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = (
    "import sys\n"
    "from omni_rl.logging import attach_run_log\n"
    "attach_run_log(sys.argv[1])\n"
    "from omni_rl.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)
SILENCED = ("Loading weights", "Writing model shards", "cannot be saved")
METRIC_LINE = re.compile(r"^step \d+ \| [a-z_]+=\S+( [a-z_]+=\S+)*$")
LONG = "y" * 1500  # over the tiny Qwen3's 496-token prompt limit: truncated, with a warning


def command(out: Path, steps: int) -> list[str]:
    return [
        sys.executable, "-c", LAUNCHER, str(out), "recipe=tiny_qwen3_grpo", f"trainer.total_steps={steps}",
        f"trainer.output_dir={out}", "trainer.logger_options.progress_bar=true", "trainer.prompts_per_step=2",
        f"data.prompts=[Say something.,{LONG}]", "algo.family_options.overlong_prompts=truncate",
    ]


def env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "CI")}


def run_in_pipe(cmd: list[str]) -> tuple[int, str]:
    result = subprocess.run(cmd, cwd=REPO_ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            timeout=600)
    return result.returncode, result.stdout.decode("utf-8", "replace")


def run_on_terminal(cmd: list[str]) -> tuple[int, str]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # rows, columns
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env(), stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=600), b"".join(chunks).decode("utf-8", "replace")


def screen_lines(raw: str) -> list[str]:
    """The lines a terminal shows: a carriage return goes back to the line's start and what
    follows overwrites it."""
    shown = []
    for line in raw.replace("\r\n", "\n").split("\n"):
        cells: list[str] = []
        col = 0
        for segment in re.split(r"(\r)", line):
            if segment == "\r":
                col = 0
                continue
            for ch in segment:
                if col < len(cells):
                    cells[col] = ch
                else:
                    cells.append(ch)
                col += 1
        shown.append("".join(cells).rstrip())
    return shown


def check_run_log(out: Path) -> None:
    log = (out / "train.log").read_text(encoding="utf-8")
    assert re.search(r"INFO omni_rl.metrics: step 1 \| reward=", log), log
    assert re.search(r"WARNING omni_rl.families.autoregressive: data.prompts: 1 of 2 prompts are over .*truncated", log), log


def test_a_run_into_a_pipe_has_whole_lines_and_no_bars(tmp_path):
    out = tmp_path / "pipe"
    rc, text = run_in_pipe(command(out, 3))
    assert rc == 0, text
    assert "\r" not in text, "progress-bar redraws in a pipe:\n" + text  # glued to the next line
    metric_lines = [line for line in text.splitlines() if line.startswith("step ")]
    assert [line.split(" |")[0] for line in metric_lines] == ["step 0", "step 1", "step 2", "step 3"], text
    assert all(METRIC_LINE.match(line) for line in metric_lines), text
    assert sum("step " in line and "|" in line for line in text.splitlines()) == len(metric_lines), text
    for message in SILENCED:
        assert message not in text, text
    assert "WARNING omni_rl.families.autoregressive: data.prompts: 1 of 2 prompts are over" in text  # news is kept
    check_run_log(out)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses a Linux pty")
def test_a_run_on_a_terminal_keeps_the_bar_apart_from_the_lines(tmp_path):
    out = tmp_path / "tty"
    rc, raw = run_on_terminal(command(out, 3))
    assert rc == 0, raw
    assert "step/s" in raw  # the bar was drawn
    lines = screen_lines(raw)
    metric_lines = [line for line in lines if re.match(r"^step \d+ \|", line)]
    assert [line.split(" |")[0] for line in metric_lines] == ["step 0", "step 1", "step 2", "step 3"], lines
    assert all(METRIC_LINE.match(line) for line in metric_lines), lines  # nothing of the bar after them
    assert not [line for line in lines if re.search(r"step \d+ \|", line) and "%|" in line], lines
    for message in SILENCED:
        assert message not in raw, lines
    warning = [line for line in lines if "WARNING omni_rl.families.autoregressive" in line]
    assert len(warning) == 1 and warning[0].startswith("WARNING"), lines  # on a line of its own
    check_run_log(out)

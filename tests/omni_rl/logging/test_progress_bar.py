"""ProgressBar: absolute step position, short postfix keys, no crash without a TTY."""
import io

from omni_rl.logging import ProgressBar


def test_progress_bar_postfix_and_position_without_tty():
    stream = io.StringIO()  # not a TTY
    bar = ProgressBar(total=10, file=stream)
    bar.update(1, {"reward/total/mean": 0.123456, "loss/policy": 0.5, "perf/x": 3.0})
    bar.update(3, {"loss/kl": 0.01})
    assert bar.n == 3
    bar.update(4)  # no metrics: keeps going
    bar.close()
    text = stream.getvalue()
    assert "reward=0.1235" in text and "loss=0.5" in text
    assert "kl=0.01" in text and "perf" not in text  # postfix keys merge across steps


def test_progress_bar_resume_and_disable():
    bar = ProgressBar(total=10, initial=5, disable=True)
    bar.update(6, {"reward/total/mean": 1.0})
    assert bar.n == 6
    bar.close()

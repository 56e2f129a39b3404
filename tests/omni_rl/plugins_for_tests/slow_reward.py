"""A reward that takes its time, for tests that need a step still running when they act.

Loaded by a subprocess with `plugins=[slow_reward]` and this folder on PYTHONPATH. Each call
first touches the file named by $SLOW_REWARD_MARKER (so a test knows a step is under way), then
sleeps `seconds` and scores every response 0.
"""
import os
import time
from pathlib import Path

from omni_rl.reward import register_reward


@register_reward("tests.slow")
def slow(*, seconds: float = 30.0):
    def score(samples, prompts, metadata):
        marker = os.environ.get("SLOW_REWARD_MARKER")
        if marker:
            Path(marker).touch()
        time.sleep(seconds)
        return [0.0] * len(prompts)

    return score

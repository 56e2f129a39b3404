"""A run with no learning signal says so (issue 45, M4): a step in which every group's samples
score the same warns, naming the rewards and their values; `algo.advantage_options.
max_uniform_steps` such steps in a row are one error line (exit 1) naming what to check."""
from __future__ import annotations

import logging

import pytest
import torch

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.reward import register_reward
from omni_rl.trainer import PPOTrainer
from omni_rl.trainer.no_signal import NoSignalError, NoSignalWatch, all_groups_uniform, describe_rewards
from tests.tiny_runs import TINY_SD3


@register_reward("tests.no_signal.constant")
def constant(*, value: float = 0.25):
    """Every sample scores `value`: a reward that cannot tell samples apart."""
    return lambda images, prompts, metadata: [value] * len(prompts)


CONSTANT = "reward.rewards=[{name: tests.no_signal.constant}]"


def test_uniform_means_equal_within_every_group():
    groups = torch.tensor([0, 0, 1, 1])
    assert all_groups_uniform(torch.tensor([0.5, 0.5, 2.0, 2.0]), groups)  # each group equal, the groups not
    assert not all_groups_uniform(torch.tensor([0.5, 0.5, 2.0, 2.1]), groups)
    # Groups need not be contiguous; a spread of 1e-7 on rewards of size 1 is round-off, 1e-3 is not.
    assert all_groups_uniform(torch.tensor([1.0, 3.0, 1.0 + 1e-7, 3.0]), torch.tensor([7, 2, 7, 2]))
    assert not all_groups_uniform(torch.tensor([1.0, 3.0, 1.001, 3.0]), torch.tensor([7, 2, 7, 2]))


def test_the_rewards_are_named_with_their_values():
    text = describe_rewards({"asr_wer": torch.zeros(8), "speech_rate": torch.tensor([0.5] * 4 + [0.75] * 4)})
    assert text == "asr_wer = 0 on all 8 samples; speech_rate in [0.5, 0.75], equal within each group"


def test_the_watch_counts_steps_in_a_row(caplog):
    watch = NoSignalWatch(2)
    groups = torch.tensor([0, 0, 1, 1])
    flat, varied = torch.zeros(4), torch.tensor([0.0, 1.0, 0.0, 1.0])
    with caplog.at_level(logging.WARNING, logger="omni_rl.trainer.no_signal"):
        watch.observe(1, flat, groups, {"r": flat})
        watch.observe(2, varied, groups, {"r": varied})  # a step with signal starts the count again
        watch.observe(3, flat, groups, {"r": flat})
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["step 1", "step 3"]
    with pytest.raises(NoSignalError, match=r"^steps 3-4: no learning signal 2 steps in a row"):
        watch.observe(4, flat, groups, {"r": flat})
    off = NoSignalWatch(0)
    for step in range(1, 20):
        off.observe(step, flat, groups, {"r": flat})  # 0: warns, never stops


def test_a_constant_reward_warns_on_every_step(tmp_path, caplog):
    cfg = load_config([*TINY_SD3, CONSTANT, "trainer.total_steps=2", f"trainer.output_dir={tmp_path / 'run'}"])
    with caplog.at_level(logging.WARNING, logger="omni_rl.trainer.no_signal"):
        PPOTrainer(cfg).fit()
    warnings = [r.getMessage() for r in caplog.records if r.name == "omni_rl.trainer.no_signal"]
    assert len(warnings) == 2
    # 2 prompts x 4 samples of the tiny run.
    assert warnings[0].startswith(
        "step 1: no learning signal: in each of the 2 groups every sample scored the same (tests.no_signal.constant = "
        "0.25 on all 8 samples), so every advantage is zero and this update does nothing; check the rewards' settings "
        "(a speech reward's language and text_key")
    assert warnings[1].endswith("(2 such step(s) in a row; the run stops at 10, algo.advantage_options.max_uniform_steps)")


def test_two_uniform_steps_in_a_row_are_one_error_line(tmp_path, capsys):
    code = main([*TINY_SD3, CONSTANT, "trainer.total_steps=4", "algo.advantage_options.max_uniform_steps=2",
                 f"trainer.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 1 and "Traceback" not in err and len(errors) == 1, err
    assert errors[0].startswith(
        "error: steps 1-2: no learning signal 2 steps in a row (algo.advantage_options.max_uniform_steps=2): in each "
        "group every sample scored the same (tests.no_signal.constant = 0.25 on all 8 samples), so every advantage "
        "was zero and nothing trained; check the rewards' settings")
    assert errors[0].endswith("or set algo.advantage_options.max_uniform_steps=0 to go on regardless")


def test_a_negative_count_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"^algo.advantage_options.max_uniform_steps=-1: expected >= 1 steps, or 0"):
        load_config([*TINY_SD3, "algo.advantage_options.max_uniform_steps=-1"])

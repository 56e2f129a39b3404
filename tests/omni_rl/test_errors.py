"""The two error bases: every error the command line reports derives from one of them and
carries its exit code, and `cli.py` catches nothing else (issue 24, "one owner for each
shared thing")."""
from __future__ import annotations

import ast
import signal
from pathlib import Path

import pytest

import omni_rl.cli
from omni_rl.data.prompts import PromptFileError
from omni_rl.device import DeviceError
from omni_rl.engine.base import NonFiniteLossError
from omni_rl.errors import OmniConfigError, OmniRunError
from omni_rl.models.loading import MissingWeightsError, ModelFolderError
from omni_rl.plugins import PluginError
from omni_rl.registry import RegistryError
from omni_rl.reward.manager import RewardError
from omni_rl.reward.registry import RewardConfigError
from omni_rl.rollout.base import RolloutEngineError
from omni_rl.rollout.vllm_omni.availability import BackendUnavailableError
from omni_rl.trainer.checkpoint import CheckpointError
from omni_rl.trainer.interrupt import TrainingInterrupted
from omni_rl.trainer.run_dir import OutputWriteError, RunDirError
from omni_rl.workers.errors import WorkerFailedError

CONFIG_ERRORS = (PromptFileError, DeviceError, ModelFolderError, PluginError, RegistryError, RewardConfigError,
                 CheckpointError, RunDirError, BackendUnavailableError)
RUN_ERRORS = (NonFiniteLossError, MissingWeightsError, RewardError, RolloutEngineError, OutputWriteError,
              WorkerFailedError)


@pytest.mark.parametrize("cls", CONFIG_ERRORS, ids=lambda c: c.__name__)
def test_bad_input_errors_are_config_errors_with_exit_2(cls):
    assert issubclass(cls, OmniConfigError)
    assert cls("x").exit_code == 2


@pytest.mark.parametrize("cls", RUN_ERRORS, ids=lambda c: c.__name__)
def test_run_time_errors_are_run_errors_with_exit_1(cls):
    assert issubclass(cls, OmniRunError) and not issubclass(cls, OmniConfigError)
    assert cls("x").exit_code == 1


def test_old_builtin_bases_still_hold_for_callers_that_catch_them():
    # Callers written against the builtin types keep working.
    assert issubclass(RegistryError, KeyError) and issubclass(PluginError, ImportError)
    assert issubclass(CheckpointError, FileNotFoundError) and issubclass(MissingWeightsError, FileNotFoundError)
    assert issubclass(ModelFolderError, MissingWeightsError) and issubclass(NonFiniteLossError, FloatingPointError)
    assert issubclass(RewardConfigError, TypeError) and issubclass(RewardConfigError, ValueError)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupt_is_a_run_error_that_carries_128_plus_its_signal(signum):
    err = TrainingInterrupted(signum, step=3, checkpoint=None)
    assert isinstance(err, OmniRunError)
    assert err.exit_code == 128 + signum


def _caught_types(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            kinds = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            names += [ast.unparse(k) for k in kinds]
    return names


def test_the_cli_catches_at_most_three_exception_types():
    tree = ast.parse(Path(omni_rl.cli.__file__).read_text(encoding="utf-8"))
    # What the command line reports: the handlers of main and _main (check_prompt_kind, a
    # helper, turns an adapter's ValueError into a PromptFileError; it reports nothing).
    entry = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in ("main", "_main")]
    caught = {name for node in entry for name in _caught_types(node)}
    assert caught == {"OmniConfigError", "OmniRunError", "KeyboardInterrupt"}


@pytest.mark.parametrize("err, code", [
    (RegistryError("unknown adapter 'X'"), 2),
    (RewardError("reward 'r' failed"), 1),
    (TrainingInterrupted(signal.SIGTERM, step=1, checkpoint=None), 143),
    (ModelFolderError("model.path='/nope': no such folder"), 2),
    (MissingWeightsError("org/model is not cached"), 1),
])
def test_the_cli_prints_one_line_and_returns_the_errors_exit_code(monkeypatch, capsys, err, code):
    import omni_rl.trainer

    def fail(cfg):
        raise err

    monkeypatch.setattr(omni_rl.trainer, "run", fail)
    monkeypatch.setattr(omni_rl.cli, "check_inputs", lambda cfg: None)
    assert omni_rl.cli.main(["recipe=tiny_sd3_flowgrpo"]) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == f"error: {err}"

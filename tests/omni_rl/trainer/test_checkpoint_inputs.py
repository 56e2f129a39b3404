"""Resume and checkpoint inputs that went wrong silently (issue 29 items 13, 16 and a part of 15):
a changed optim.lr is what the resumed run trains with; pruning never keeps a broken checkpoint
over a good one nor removes the one the run resumed from, and a kill while pruning leaves
nothing that looks like a checkpoint; a folder with no checkpoint yet says so; the fall-back
warning is said once."""
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.engine.base import apply_optim_config
from omni_rl.engine.local import LocalEngine
from omni_rl.trainer import PPOTrainer
from omni_rl.trainer.checkpoint import (
    MANIFEST_FILE, STATE_FILE, TENSORS_FILE, CheckpointError, list_checkpoints, load_checkpoint, prune_checkpoints,
    save_checkpoint,
)
from omni_rl.trainer.leftovers import remove_leftovers
from omni_rl.models.base import OptimizerGroup

SMALL = [
    "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4", "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=2", "rollout.sampling_options.num_steps=4", "rollout.sampling_options.sde_window_size=2",
    "rollout.sampling_options.sde_window_range=[0,3]", "trainer.val_every=0", "trainer.logger_options.progress_bar=false",
    "trainer.loggers=[jsonl]",
]


class TinyModel:
    """What `LocalEngine` and `save_checkpoint` ask of a model."""

    def __init__(self):
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 3)
        self.cfg = SimpleNamespace(lora=SimpleNamespace(enabled=True))

    def trainable_parameters(self):
        return list(self.layer.parameters())

    def optimizer_groups(self):
        return [OptimizerGroup("policy", self.trainable_parameters())]

    def named_trainable_tensors(self):
        return {n: p.detach() for n, p in self.layer.named_parameters()}

    def load_named_tensors(self, tensors):
        with torch.no_grad():
            for name, p in self.layer.named_parameters():
                p.copy_(tensors[name])

    def save_trained(self, folder):
        Path(folder).mkdir()
        (Path(folder) / "weights.bin").write_bytes(b"export")


def _optim(lr):
    return load_config(["recipe=tiny_sd3_flowgrpo", f"optim.lr={lr}"]).optim


def _trained_engine(lr):
    model = TinyModel()
    engine = LocalEngine(model, _optim(lr))
    model.layer(torch.randn(5, 4)).pow(2).sum().backward()
    engine.optimizer_step()
    return model, engine


def step_dir(out, step):
    return out / "checkpoints" / f"step_{step:06d}"


# -- item 13: a resume with a changed lr trains with it ---------------------------------------


def test_a_resumed_engine_steps_with_the_new_lr_and_keeps_its_moments(tmp_path, caplog):
    model, engine = _trained_engine(1e-3)
    folder = save_checkpoint(tmp_path, 1, engine.state_dict(), model, "model: {}\n", keep_last=0)
    state = load_checkpoint(str(folder))
    resumed = LocalEngine(TinyModel(), _optim(5e-2))
    with caplog.at_level(logging.WARNING, logger="omni_rl.engine.base"):
        resumed.load_state_dict(state)
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [5e-2]
    moments = resumed.optimizer.state[resumed.params[0]]
    assert int(moments["step"]) == 1 and moments["exp_avg"].abs().sum() > 0  # the checkpoint's state is kept
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "optim.lr: 0.001 -> 0.05" in said[0] and "not the checkpoint's" in said[0]
    resumed.model.layer(torch.randn(5, 4)).pow(2).sum().backward()
    assert resumed.optimizer_step()["actor/lr"] == 5e-2


def test_the_same_optim_config_says_nothing(caplog):
    _, engine = _trained_engine(1e-3)
    with caplog.at_level(logging.WARNING, logger="omni_rl.engine.base"):
        assert apply_optim_config(engine.optimizer, _optim(1e-3)) == []
    assert not caplog.records


# -- item 16: pruning and leftovers -----------------------------------------------------------


def _checkpoints(out, steps):
    model, engine = _trained_engine(1e-3)
    for step in steps:
        save_checkpoint(out, step, engine.state_dict(), model, "model: {}\n", keep_last=0)


def _names(out):
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def test_pruning_removes_a_damaged_checkpoint_before_a_good_one(tmp_path):
    _checkpoints(tmp_path, [1, 2, 3])
    (step_dir(tmp_path, 2) / TENSORS_FILE).write_bytes(b"cut")  # step 2 is broken, step 1 good
    prune_checkpoints(tmp_path, 2, newest=step_dir(tmp_path, 3))
    assert _names(tmp_path) == ["step_000001", "step_000003"]


def test_pruning_never_removes_the_checkpoint_the_run_resumed_from(tmp_path):
    _checkpoints(tmp_path, [1, 2, 3])
    prune_checkpoints(tmp_path, 1, newest=step_dir(tmp_path, 3), protect=step_dir(tmp_path, 1))
    assert _names(tmp_path) == ["step_000001", "step_000003"]


def test_a_pruned_folder_leaves_no_checkpoint_behind_and_a_partly_deleted_one_is_removed_at_start(tmp_path, monkeypatch):
    _checkpoints(tmp_path, [1, 2, 3])
    # A kill while an earlier version pruned step 1: its tensors gone, its manifest still there.
    (step_dir(tmp_path, 1) / TENSORS_FILE).unlink()
    # A kill during this version's pruning of step 2: it was renamed to a temporary first.
    import omni_rl.trainer.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint.shutil, "rmtree", lambda *a, **k: None)  # the kill: nothing deleted
    prune_checkpoints(tmp_path, 1, newest=step_dir(tmp_path, 3), protect=step_dir(tmp_path, 1))
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000001", "step_000003"]
    done = remove_leftovers(tmp_path)
    assert any("step_000001/ (partly deleted: 1 of the files" in d for d in done), done
    assert any(d.startswith("removed checkpoints/.step_000002.") for d in done), done
    assert _names(tmp_path) == ["step_000003"]


def test_a_damaged_but_whole_checkpoint_is_left_for_the_resume_to_name(tmp_path):
    _checkpoints(tmp_path, [1])
    (step_dir(tmp_path, 1) / STATE_FILE).write_text("garbage")
    assert remove_leftovers(tmp_path) == [] and _names(tmp_path) == ["step_000001"]


def test_resuming_a_run_that_stopped_before_its_first_checkpoint_says_no_checkpoint_yet(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    (out / "config.yaml").write_text("model: {}\n")
    code = main(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={out}", f"trainer.resume={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "no checkpoint yet" in err[0] and "start again with trainer.overwrite=true" in err[0]
    # A folder that is no run at all keeps its message.
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint there"):
        load_checkpoint(str(tmp_path / "empty"))


# -- item 15: the fall-back warning said once ------------------------------------------------


def test_the_fall_back_is_said_once(tmp_path, caplog):
    _checkpoints(tmp_path, [1, 2])
    (step_dir(tmp_path, 2) / MANIFEST_FILE).write_text("{}")
    with caplog.at_level(logging.WARNING, logger="omni_rl.trainer.checkpoint"):
        for _ in range(3):  # the CLI's check, the run folder and the trainer each resolve it
            assert load_checkpoint(str(tmp_path))["step"] == 1
    said = [r.getMessage() for r in caplog.records]
    assert sum("falling back to" in m for m in said) == 1 and sum("fails verification" in m for m in said) == 1


# -- item 13 through the trainer ------------------------------------------------------------


def test_a_resumed_run_trains_with_the_new_lr(tmp_path):
    out = tmp_path / "run"
    PPOTrainer(load_config([*SMALL, f"trainer.output_dir={out}", "trainer.total_steps=1", "trainer.save_every=1",
                            "optim.lr=1e-3"])).fit()
    PPOTrainer(load_config([*SMALL, f"trainer.output_dir={out}", "trainer.total_steps=2", "trainer.save_every=1",
                            "optim.lr=5e-3", f"trainer.resume={out}"])).fit()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    lrs = {row["step"]: row["actor/lr"] for row in rows if "actor/lr" in row}
    assert lrs == {1: 1e-3, 2: 5e-3}

"""Checkpoints that cannot run code, say which file is bad, and refuse a run they do not fit.

One tiny SD3 run (two steps, a checkpoint after each) is made once per module; each test copies
it and damages the copy: a planted pickle (whose `__reduce__` would create a marker file),
truncated / garbage / `{}` / bit-flipped files, another model config. The loaders are called
directly where the point is what they read, and through `PPOTrainer` or the CLI where it is
what a user sees (one `error:` line naming the file, or a warning and a fall-back).
"""
import json
import logging
import pickle
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.trainer import PPOTrainer
from omni_rl.trainer.checkpoint import (
    MANIFEST_FILE,
    STATE_FILE,
    TENSORS_FILE,
    CheckpointError,
    check_compatible,
    check_dcp_metadata,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    write_manifest,
)
from tests.tiny_runs import TINY_SD3


def config(out, *overrides):
    return load_config([*TINY_SD3, f"trainer.output_dir={out}", *overrides])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """An output folder with checkpoints/step_000001 and step_000002 (tiny SD3, LoRA)."""
    out = tmp_path_factory.mktemp("ckpt") / "run"
    PPOTrainer(config(out, "trainer.total_steps=2", "trainer.save_every=1", "trainer.keep_last_checkpoints=0")).fit()
    return out


@pytest.fixture
def run_dir(trained, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


def step_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step:06d}"


class Planted:
    """Unpickling this creates `marker` (`open(marker, "w")`): proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def plant(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps(Planted(marker)))
    assert not marker.exists()


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


# --- point 5: nothing unpickled ----------------------------------------------------------------
def test_a_planted_old_format_pickle_does_not_run_and_is_refused_in_one_line(run_dir, tmp_path, capsys):
    folder = step_dir(run_dir, 2)
    for name in (MANIFEST_FILE, STATE_FILE, TENSORS_FILE):
        (folder / name).unlink()
    marker = tmp_path / "pwned"
    plant(folder / "trainer_state.pt", marker)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(str(folder))
    text = one_line(err)
    assert "trainer_state.pt" in text and "pickle format" in text and "re-run the training" in text
    assert str(folder / "lora") in text  # where the weights of the old checkpoint are
    # What a user sees: exit 2, one `error:` line, no traceback, and the pickle never ran.
    code = main([*TINY_SD3, f"trainer.output_dir={tmp_path / 'new'}", "trainer.total_steps=3", f"trainer.resume={folder}"])
    captured = capsys.readouterr()
    assert code == 2
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "trainer_state.pt" in errors[0] and "Traceback" not in captured.err
    assert not marker.exists()


@pytest.mark.parametrize("target", [STATE_FILE, TENSORS_FILE])
def test_a_pickle_in_place_of_a_state_file_is_not_unpickled_even_with_a_fresh_manifest(run_dir, tmp_path, target):
    folder = step_dir(run_dir, 2)
    marker = tmp_path / "pwned"
    plant(folder / target, marker)
    write_manifest(folder)  # the attacker rewrote the manifest too: integrity passes, parsing must not run it
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(str(folder))
    assert str(folder / target) in one_line(err)
    assert not marker.exists()


def test_dcp_metadata_is_read_through_an_allow_list(tmp_path):
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(1, 3)).sum().backward()
    optimizer.step()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp_path / "sharded"))
    check_dcp_metadata(tmp_path / "sharded" / ".metadata")  # what DCP writes passes

    marker = tmp_path / "pwned"
    plant(tmp_path / "sharded" / ".metadata", marker)
    with pytest.raises(CheckpointError, match=r"\.metadata: not DCP metadata") as err:
        check_dcp_metadata(tmp_path / "sharded" / ".metadata")
    one_line(err)
    assert not marker.exists()


# --- point 6: integrity ------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty_object", "bit_flip", "delete"])
def test_a_damaged_file_is_one_error_naming_it(run_dir, damage):
    folder = step_dir(run_dir, 2)
    target = folder / (TENSORS_FILE if damage == "bit_flip" else STATE_FILE)
    data = bytearray(target.read_bytes())
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        target.write_bytes(b"\x00\xffnot a checkpoint" * 10)
    elif damage == "empty_object":
        target.write_text("{}")
    elif damage == "bit_flip":
        data[-7] ^= 0x10  # inside the last tensor's data: safetensors itself would load it
        target.write_bytes(data)
    else:
        target.unlink()
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(str(folder))
    text = one_line(err)
    assert str(target) in text
    assert {"truncate": "bytes", "garbage": "bytes", "empty_object": "bytes", "bit_flip": "sha256",
            "delete": "missing"}[damage] in text


def test_a_consistent_but_invalid_state_names_the_file(run_dir):
    folder = step_dir(run_dir, 2)
    (folder / STATE_FILE).write_text("{}")
    write_manifest(folder)
    with pytest.raises(CheckpointError, match="not a valid trainer state") as err:
        load_checkpoint(str(folder))
    assert str(folder / STATE_FILE) in one_line(err)


def test_a_missing_manifest_is_an_error(run_dir):
    folder = step_dir(run_dir, 2)
    (folder / MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointError, match="manifest.json: missing") as err:
        load_checkpoint(str(folder))
    one_line(err)


def test_the_output_folder_falls_back_to_the_newest_good_checkpoint_with_a_warning(run_dir, tmp_path, caplog):
    latest = step_dir(run_dir, 2)
    marker = tmp_path / "pwned"
    plant(latest / TENSORS_FILE, marker)  # damaged, and a pickle besides
    with caplog.at_level(logging.WARNING, logger="omni_rl.trainer.checkpoint"):
        state = load_checkpoint(str(run_dir))
    assert state["step"] == 1 and state["folder"] == str(step_dir(run_dir, 1))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step_000002" in w and "fails verification" in w and TENSORS_FILE in w for w in warnings), warnings
    assert any("falling back to" in w and "step_000001" in w for w in warnings), warnings
    assert not marker.exists()

    # A named checkpoint folder is what the user asked for: no fall-back, an error.
    with pytest.raises(CheckpointError, match=TENSORS_FILE):
        load_checkpoint(str(latest))
    # None verifies: an error that names the latest and why.
    (step_dir(run_dir, 1) / STATE_FILE).write_text("{}")
    with pytest.raises(CheckpointError, match="none of its 2 checkpoints verifies; the latest, step_000002") as err:
        load_checkpoint(str(run_dir))
    one_line(err)


def test_resume_through_the_trainer_uses_the_fallback_and_continues_from_it(run_dir, caplog):
    (step_dir(run_dir, 2) / STATE_FILE).write_text("garbage")
    with caplog.at_level(logging.WARNING):
        trainer = PPOTrainer(config(run_dir, "trainer.total_steps=2", f"trainer.resume={run_dir}"))
    try:
        assert trainer.start_step == 1
        assert any("falling back to" in r.getMessage() for r in caplog.records)
    finally:
        trainer._close()


# --- point 7: compatibility --------------------------------------------------------------------
@pytest.mark.parametrize("override, expected", [
    ("model.lora.rank=4", "model.lora.rank=8, this run has model.lora.rank=4; resume with model.lora.rank=8"),
    ("model.lora.alpha=64", "model.lora.alpha=16.0, this run has model.lora.alpha=64.0"),
    ("model.lora.enabled=false", "model.lora.enabled=true, this run has model.lora.enabled=false"),
    # null is the adapter's default; here the tensor names show the difference.
    ("model.lora.target_modules=[to_q]", "do not fit this model: 26 of the checkpoint's trainable tensors are not in this model (e.g. "
                                         "'transformer_blocks.0.attn.add_k_proj.lora_A.default.weight'); "
                                         "model.lora.target_modules=null there, [to_q] here"),
])
def test_another_model_config_is_refused_naming_the_key(run_dir, override, expected):
    with pytest.raises(CheckpointError, match="trained with|do not fit") as err:
        PPOTrainer(config(run_dir / "again", "trainer.total_steps=3", override, f"trainer.resume={run_dir}"))
    text = one_line(err)
    assert expected in text and str(step_dir(run_dir, 2)) in text


def test_a_text_checkpoint_is_refused_by_the_sd3_recipe(tmp_path):
    text_run = tmp_path / "text"
    PPOTrainer(load_config(["recipe=tiny_qwen3_grpo", "trainer.total_steps=1", "trainer.val_every=0",
                            "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", "rollout.sampling_options.max_new_tokens=4",
                            f"trainer.output_dir={text_run}"])).fit()
    with pytest.raises(CheckpointError, match="model.adapter=Qwen3ForCausalLM, this run has "
                                              "model.adapter=StableDiffusion3Pipeline") as err:
        PPOTrainer(config(tmp_path / "sd3", "trainer.total_steps=2", f"trainer.resume={text_run}"))
    one_line(err)


def test_trainable_tensors_of_another_shape_are_refused(run_dir):
    state = load_checkpoint(str(run_dir))
    shapes = state["trainable_tensors"]
    name = sorted(shapes)[0]
    cfg = config(run_dir)
    tensors = {n: torch.zeros(s) for n, s in shapes.items()}
    tensors[name] = torch.zeros([s + 1 for s in shapes[name]])
    tensors["extra.lora_A.weight"] = torch.zeros(2, 2)
    check_compatible(state, cfg, SimpleNamespace(named_trainable_tensors=lambda: dict(state["trainable"])))
    with pytest.raises(CheckpointError, match="do not fit this model") as err:
        check_compatible(state, cfg, SimpleNamespace(named_trainable_tensors=lambda: tensors))
    text = one_line(err)
    assert "1 of this model's trainable tensors are not in the checkpoint (e.g. 'extra.lora_A.weight')" in text
    assert f"1 differ in shape (e.g. {name!r}" in text


def test_a_changed_option_is_named_with_the_tensors_it_changed(run_dir):
    """Issue 45, L8: a talker resumed with another model.adapter_options.trainable said "18 of its are not
    in this model", naming neither the setting nor the noun."""
    state = load_checkpoint(str(run_dir))
    state["config"]["model"]["adapter_options"] = {**state["config"]["model"].get("adapter_options", {}), "trainable": "both"}
    tensors = dict(state["trainable"])
    dropped = sorted(tensors)[:3]
    for name in dropped:
        del tensors[name]
    with pytest.raises(CheckpointError) as err:
        check_compatible(state, config(run_dir), SimpleNamespace(named_trainable_tensors=lambda: tensors))
    text = one_line(err)
    assert f"do not fit this model: 3 of the checkpoint's trainable tensors are not in this model (e.g. {dropped[0]!r}); " \
           f"model.adapter_options.trainable=both there, null here; resume with the model settings of " in text
    assert text.endswith("config.yaml (model.adapter_options.trainable=both)")


# --- point 8: nothing to train -----------------------------------------------------------------
def test_total_steps_not_above_the_checkpoint_step_is_a_warning(run_dir, caplog):
    with caplog.at_level(logging.WARNING):
        PPOTrainer(config(run_dir, "trainer.total_steps=1", f"trainer.resume={run_dir}")).fit()
    assert any(r.getMessage() == "trainer.total_steps=1 is not above the checkpoint's step 2: nothing to train; "
                                 "raise trainer.total_steps to continue" for r in caplog.records)


# --- the format itself, without a model ----------------------------------------------------------
class StubModel:
    """What `save_checkpoint` asks of a model: trainable tensors, cfg.lora, save_trained."""

    def __init__(self):
        self.layer = torch.nn.Linear(4, 3)
        self.cfg = SimpleNamespace(lora=SimpleNamespace(enabled=True))

    def named_trainable_tensors(self):
        return {n: p.detach() for n, p in self.layer.named_parameters()}

    def save_trained(self, folder):
        Path(folder).mkdir()
        (Path(folder) / "weights.bin").write_bytes(b"export")


def stub_engine_state(model):
    optimizer = torch.optim.AdamW(model.layer.parameters(), lr=1e-2, betas=(0.8, 0.95))
    for _ in range(2):
        model.layer(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
    trainable = {k: v.clone() for k, v in model.named_trainable_tensors().items()}
    return {"trainable": trainable, "optimizer": optimizer.state_dict()}


def test_the_state_round_trips_exactly(tmp_path):
    model = StubModel()
    state = stub_engine_state(model)
    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    folder = save_checkpoint(tmp_path, 7, state, model, "model: {}\n", keep_last=0)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    loaded = load_checkpoint(str(folder))
    assert loaded["step"] == 7
    for k, v in state["trainable"].items():
        assert torch.equal(loaded["trainable"][k], v)
    opt, back = state["optimizer"], loaded["optimizer"]
    assert back["param_groups"] == opt["param_groups"]  # betas a tuple again, lr exact
    assert back["state"].keys() == opt["state"].keys()
    for index, entries in opt["state"].items():
        assert back["state"][index].keys() == entries.keys()
        for key, value in entries.items():
            assert torch.equal(back["state"][index][key], value), (index, key)
    from omni_rl.trainer.checkpoint import set_rng_state

    set_rng_state(loaded["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected
    # Every file is in the manifest, the export too.
    listed = json.loads((folder / MANIFEST_FILE).read_text())["files"]
    assert sorted(listed) == ["config.yaml", "lora/weights.bin", STATE_FILE, TENSORS_FILE]


def fake_checkpoints(out: Path, steps) -> None:
    for step in steps:
        folder = step_dir(out, step)
        folder.mkdir(parents=True)
        (folder / MANIFEST_FILE).write_text("{}")


def test_pruning_never_deletes_the_checkpoint_just_written(tmp_path):
    # An earlier run left steps 4 and 6; this run writes step 2 with keep_last=2.
    fake_checkpoints(tmp_path, [4, 6])
    model = StubModel()
    written = save_checkpoint(tmp_path, 2, stub_engine_state(model), model, "model: {}\n", keep_last=2)
    assert written.is_dir()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002", "step_000004", "step_000006"]


def test_pruning_keeps_the_newest_keep_last_counting_the_new_one(tmp_path):
    fake_checkpoints(tmp_path, [1, 2, 3, 9])
    prune_checkpoints(tmp_path, 2, newest=step_dir(tmp_path, 3))
    # 3 (just written) and 2 before it; 9 is a higher step, not this run's to remove.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002", "step_000003", "step_000009"]
    prune_checkpoints(tmp_path, 1, newest=step_dir(tmp_path, 3))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000003", "step_000009"]


# --- issue 45 L7: a NaN in a checkpoint, with its manifest re-signed -----------------------------
def _plant_nan(folder: Path, prefix: str = "trainable/") -> str:
    """Set one value of the first tensor named `prefix...` of the checkpoint to NaN and re-sign
    its manifest, as someone editing the file would; returns the tensor's name."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / TENSORS_FILE)
    name = sorted(k for k in tensors if k.startswith(prefix))[0]
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, folder / TENSORS_FILE)
    write_manifest(folder)
    return name


def test_a_nan_in_a_checkpoint_is_one_error_naming_the_file_and_the_tensor(run_dir):
    folder = step_dir(run_dir, 2)
    name = _plant_nan(folder, "optimizer/")  # an AdamW moment: not the weights, as bad
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(str(folder))
    assert one_line(err).startswith(f"trainer.resume='{folder}': {folder / TENSORS_FILE}: tensor {name!r} holds 1 "
                                    f"NaN or infinite value (of ")
    # From the output folder, the newest checkpoint without one.
    assert load_checkpoint(str(run_dir))["step"] == 1


def test_a_nan_in_a_talker_checkpoint_is_one_line_before_the_model_loads(tmp_path, capsys):
    # The probe's case: a 45-line RuntimeError (probability tensor contains nan) after the resume.
    from tests.tiny_runs import TINY_TALKER

    out = tmp_path / "talker"
    PPOTrainer(load_config([*TINY_TALKER, f"trainer.output_dir={out}", "trainer.total_steps=1",
                            "trainer.save_every=1"])).fit()
    folder = step_dir(out, 1)
    name = _plant_nan(folder)
    capsys.readouterr()  # the first run's own output
    code = main([*TINY_TALKER, f"trainer.output_dir={out}", "trainer.total_steps=2", f"trainer.resume={folder}"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == (f"error: trainer.resume='{folder}': {folder / TENSORS_FILE}: tensor {name!r} holds 1 NaN or "
                        f"infinite value (of 896): the run that wrote it diverged, or the file was changed; resume "
                        f"from another checkpoint, or from the output folder (its newest checkpoint that verifies)")
    assert not step_dir(out, 2).exists()

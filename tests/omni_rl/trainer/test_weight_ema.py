"""The run-wide EMA of the trained weights (`omni_rl.trainer.weight_ema`, kept by the one-process
actor group) on the tiny SD3 FlowGRPO recipe: the EMA after the run's optimizer steps is the one
worked out by hand from the weights after each step; a resumed run's EMA is the straight run's;
a checkpoint without an EMA resumes with one started from its weights; validation with both
weights logs `val/*` and `val_ema/*`; the export's `ema/` folder is a LoRA diffusers loads; bad
values are one line at load."""
import json
import logging

import pytest
import torch
from safetensors.torch import load_file

from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.trainer import PPOTrainer
from omni_rl.trainer.checkpoint import checkpoint_ema_tensors, load_checkpoint
from tests.tiny_runs import TINY_SD3

EMA = ["trainer.backend_options.ema_decay=0.9"]


def tiny_trainer(tmp_path, name, *overrides) -> PPOTrainer:
    return PPOTrainer(load_config([*TINY_SD3, f"trainer.output_dir={tmp_path / name}", *overrides]))


def records(tmp_path, name) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_the_ema_is_the_hand_computed_average_of_the_weights_after_each_optimizer_step(tmp_path):
    """2 steps x 2 mini-batches = 4 optimizer steps; with ema_update_interval=2 the EMA takes the
    weights after steps 2 and 4, with Flow-GRPO's ramp d_n = min(0.9, (1 + n) / (10 + n)):
    d_2 = 3/12 = 0.25, d_4 = 5/14."""
    trainer = tiny_trainer(tmp_path, "run", "trainer.total_steps=2", *EMA, "trainer.backend_options.ema_update_interval=2")
    model = trainer.actors.model
    history = [{n: t.detach().clone() for n, t in model.named_trainable_tensors().items()}]
    trainer.actors.engine.optimizer.register_step_post_hook(
        lambda *_: history.append({n: t.detach().clone() for n, t in model.named_trainable_tensors().items()}))
    trainer.fit()
    assert len(history) == 5  # the start, then after each of the 4 optimizer steps
    expected = {n: t.clone() for n, t in history[0].items()}
    for n, d in ((2, 3 / 12), (4, 5 / 14)):
        for name in expected:
            expected[name] = d * expected[name] + (1 - d) * history[n][name]
    ema = trainer.actors.ema
    assert ema.optimizer_steps == 4
    moved = [name for name in expected if not torch.equal(history[4][name], history[0][name])]
    assert moved  # training moved the weights, so the EMA lags them
    for name in expected:
        torch.testing.assert_close(ema.tensors[name], expected[name], atol=1e-7, rtol=1e-6, msg=name)
    assert any((ema.tensors[name] - history[4][name]).abs().max() > 1e-6 for name in moved)


def test_a_resumed_runs_ema_is_the_straight_runs(tmp_path):
    straight = tiny_trainer(tmp_path, "straight", "trainer.total_steps=4", *EMA)
    straight.fit()
    tiny_trainer(tmp_path, "split", "trainer.total_steps=2", *EMA).fit()
    resumed = tiny_trainer(tmp_path, "split", "trainer.total_steps=4", *EMA, f"trainer.resume={tmp_path / 'split'}")
    resumed.fit()
    a, b = straight.actors.ema, resumed.actors.ema
    assert a.optimizer_steps == b.optimizer_steps == 8
    assert a.tensors.keys() == b.tensors.keys()
    for name in a.tensors:
        torch.testing.assert_close(b.tensors[name], a.tensors[name], atol=1e-6, rtol=0, msg=name)
    weights = straight.actors.model.named_trainable_tensors()
    assert any(not torch.allclose(a.tensors[n], weights[n], atol=1e-6) for n in weights)

    # --eval's reader: the checkpoint's EMA, named as the trainable tensors, loads into a model.
    state = load_checkpoint(str(tmp_path / "straight"))
    saved = checkpoint_ema_tensors(state)
    assert saved.keys() == weights.keys()
    for name in saved:
        torch.testing.assert_close(saved[name], a.tensors[name].cpu(), atol=0, rtol=0, msg=name)
    straight.actors.model.load_named_tensors(saved)
    assert state["ema"]["optimizer_steps"] == 8 and state["ema"]["decay"] == 0.9


def test_a_checkpoint_without_ema_resumes_with_one_started_from_its_weights(tmp_path, caplog):
    tiny_trainer(tmp_path, "plain", "trainer.total_steps=1").fit()
    assert checkpoint_ema_tensors(load_checkpoint(str(tmp_path / "plain"))) is None
    with caplog.at_level(logging.WARNING):
        resumed = tiny_trainer(tmp_path, "plain", "trainer.total_steps=1", *EMA, f"trainer.resume={tmp_path / 'plain'}")
    assert any("holds no EMA of the weights" in r.getMessage() for r in caplog.records)
    weights = resumed.actors.model.named_trainable_tensors()
    assert any("lora_B" in n and float(t.abs().max()) > 0 for n, t in weights.items())  # the trained weights
    for name, value in weights.items():
        torch.testing.assert_close(resumed.actors.ema.tensors[name], value, atol=0, rtol=0, msg=name)
    assert resumed.actors.ema.optimizer_steps == 0
    resumed.fit()  # nothing left to train: it exports and closes


def test_validation_with_both_weights_and_the_exported_ema_lora(tmp_path):
    from diffusers import StableDiffusion3Pipeline

    from omni_rl.models.loading import resolve_model_path

    tiny_trainer(tmp_path, "both", "trainer.total_steps=2", "trainer.val_every=2", "algo.family_options.val_num_steps=4",
                 *EMA, "trainer.backend_options.val_weights=both").fit()
    out = tmp_path / "both"
    last = records(tmp_path, "both")[-1]
    for space in ("val", "val_ema"):
        assert 0 <= last[f"{space}/reward/total/mean"] <= 1
    assert (out / "samples" / "val_step_000002.png").is_file()
    assert (out / "ema" / "samples" / "val_step_000002.png").is_file()
    assert (out / "ema" / "samples" / "val_step_000002.jsonl").is_file()

    trained = load_file(out / "lora" / "pytorch_lora_weights.safetensors")
    ema = load_file(out / "lora" / "ema" / "pytorch_lora_weights.safetensors")
    assert ema.keys() == trained.keys() and all(k.startswith("transformer.") for k in ema)
    assert any(not torch.allclose(ema[k], trained[k], atol=1e-7) for k in ema if "lora_B" in k)
    # The checkpoint's export stays the trained LoRA alone.
    assert not (out / "checkpoints" / "step_000002" / "lora" / "ema").exists()
    # Either LoRA loads as a diffusers user loads one, and changes the pipeline's images.
    pipe = StableDiffusion3Pipeline.from_pretrained(resolve_model_path("tiny:sd3"), text_encoder_3=None, tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)

    def images() -> torch.Tensor:
        return pipe(prompt=["a cat", "a fox"], generator=torch.Generator().manual_seed(0), output_type="pt", height=32,
                    width=32, num_inference_steps=4, guidance_scale=4.5).images

    base = images()
    pipe.load_lora_weights(str(out / "lora" / "ema"))
    with_ema = images()
    pipe.unload_lora_weights()
    pipe.load_lora_weights(str(out / "lora"))
    with_trained = images()
    assert (with_ema - base).abs().max() > 1e-6
    assert (with_ema - with_trained).abs().max() > 1e-6


SMALL_VAL = ["trainer.total_steps=1", "trainer.val_every=1", "trainer.val_num_prompts=1",
             "trainer.val_samples_per_prompt=1", "algo.family_options.val_num_steps=2"]


def test_validation_on_training_prompts_says_so_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        tiny_trainer(tmp_path, "warn", *SMALL_VAL).fit()
    said = [r.getMessage() for r in caplog.records if "reuses the training prompts" in r.getMessage()]
    assert len(said) == 1 and "data.val_prompt_file" in said[0] and "val/*" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        tiny_trainer(tmp_path, "held_out", *SMALL_VAL, "data.val_prompts=[a zebra]").fit()
    assert not any("reuses the training prompts" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("overrides, expected", [
    (["trainer.backend_options.ema_decay=1.5"], "trainer.backend_options.ema_decay=1.5: expected in (0, 1)"),
    ([*EMA, "trainer.backend_options.ema_update_interval=-1"],
     "trainer.backend_options.ema_update_interval=-1: expected an integer >= 1"),
    (["trainer.backend_options.val_weights=ema"], "trainer.backend_options.val_weights='ema': no EMA is kept"),
    ([*EMA, "trainer.backend_options.val_weights=latest"],
     "trainer.backend_options.val_weights='latest': expected one of trained, ema, both"),
    (["trainer.backend=ray", *EMA], "trainer.backend_options.ema_decay=0.9: the EMA of the trained weights is kept "
                                    "with trainer.backend=local only"),
])
def test_bad_ema_options_fail_at_load_with_one_line(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    message = str(err.value)
    assert message.startswith(expected) and "\n" not in message, message


def test_a_pipelined_rollout_copy_validates_the_ema_and_gets_the_trained_weights_back(tmp_path):
    """trainer.pipeline=one_step_off samples with a copy of the model: validation sends it the EMA
    (under the same version) and then the trained weights again."""
    trainer = tiny_trainer(tmp_path, "piped", "trainer.total_steps=2", "trainer.pipeline=one_step_off", "trainer.val_every=2",
                           "trainer.val_num_prompts=1", "algo.family_options.val_num_steps=2", *EMA,
                           "trainer.backend_options.val_weights=both")
    assert not trainer.actors.rollout_shares_parameters
    trainer.fit()
    first, last = records(tmp_path, "piped")[0], records(tmp_path, "piped")[-1]
    # At step 0 the EMA is the weights: the same images, the same scores.
    assert first["val_ema/reward/total/mean"] == pytest.approx(first["val/reward/total/mean"], abs=1e-6)
    assert "val_ema/reward/total/mean" in last
    copy = trainer.actors.rollout_engine.model.named_trainable_tensors()
    for name, value in trainer.actors.model.named_trainable_tensors().items():
        torch.testing.assert_close(copy[name], value, atol=0, rtol=0, msg=name)
    ema = trainer.actors.ema.tensors
    assert any(not torch.allclose(ema[n], copy[n], atol=1e-7) for n in copy)

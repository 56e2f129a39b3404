"""Prompts longer than the tiny Qwen3's context (512 positions, adapters/qwen3.py): refused at
once, truncated or dropped by `algo.family_options.overlong_prompts`, and a run goes on in the last two."""
import json

import pytest
import torch

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.data.prompt_length import PromptLengthError
from omni_rl.data.prompts import load_prompt_items
from omni_rl.families import build_family
from omni_rl.models import build_model
from omni_rl.trainer import PPOTrainer

QUESTION = " What colour is the sky?"
LONG = "Once upon a time " + "x" * 2000 + QUESTION  # ~2,040 tokens with the byte-level tokenizer
ONE_STEP = [
    "recipe=tiny_qwen3_grpo", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", "trainer.val_every=0",
    "trainer.total_steps=1", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
    "trainer.mini_batch_size=4", "trainer.micro_batch_size=4", "data.prompts=null", "data.shuffle=false",
]


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text(f"Say something.\n{LONG}\n", encoding="utf-8")
    return path


def overrides(tmp_path, prompt_file, mode, *more):
    return [*ONE_STEP, f"data.prompt_file={prompt_file}", f"algo.family_options.overlong_prompts={mode}",
            f"trainer.output_dir={tmp_path / mode}", *more]


def family_of(cfg):
    return build_family(cfg, build_model(cfg.model, torch.device("cpu")))


def records(out):
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_limit_is_the_context_less_the_response_budget(tmp_path, prompt_file):
    family = family_of(load_config(overrides(tmp_path, prompt_file, "error")))
    assert family.model.context_length() == 512
    assert family.prompt_token_limit == 512 - 16  # rollout.sampling_options.max_new_tokens=16 in the recipe
    family = family_of(load_config(overrides(tmp_path, prompt_file, "error", "algo.family_options.max_prompt_tokens=100")))
    assert family.prompt_token_limit == 100
    family = family_of(load_config(overrides(tmp_path, prompt_file, "error", "algo.family_options.max_prompt_tokens=500")))
    with pytest.raises(PromptLengthError, match=r"algo.family_options.max_prompt_tokens=500 plus rollout.sampling_options.max_new_tokens=16 is 516"):
        family.prompt_token_limit


def test_error_mode_names_the_prompt_when_the_prompts_load(tmp_path, prompt_file):
    cfg = load_config(overrides(tmp_path, prompt_file, "error"))
    family = family_of(cfg)
    items = load_prompt_items(None, str(prompt_file))
    with pytest.raises(PromptLengthError) as err:
        family.fit_prompts(items, "data.prompts")
    message = str(err.value)
    assert f"data.prompt_file={str(prompt_file)!r}: prompt 1 ('Once upon a time xxx" in message
    assert "tokens with the chat template, over the 496-token limit (the model's 512 positions less " \
           "rollout.sampling_options.max_new_tokens=16)" in message
    assert "algo.family_options.overlong_prompts=truncate" in message


def test_error_mode_stops_the_run_before_its_first_step_with_one_line(tmp_path, prompt_file, capsys):
    assert main(overrides(tmp_path, prompt_file, "error")) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "Traceback" not in err, err  # (model-loading bars may precede it in-process)
    assert "'Once upon a time xxx" in errors[0] and "496-token limit" in errors[0]
    assert records(tmp_path / "error") == []  # no step ran


def test_truncate_keeps_the_question_and_the_template_end(tmp_path, prompt_file):
    cfg = load_config(overrides(tmp_path, prompt_file, "truncate"))
    family = family_of(cfg)
    items = load_prompt_items(None, str(prompt_file))
    fitted = family.fit_prompts(items, "data.prompts")
    assert fitted[0] is items[0] and fitted[1].prompt.endswith(QUESTION)
    ids = family.request(fitted[1], seed=0).prompt.input_ids.tolist()
    assert len(ids) <= 496 and len(ids) >= 490  # as much as fits
    ref = family.model.encode_prompt([{"role": "user", "content": "Z"}]).input_ids.tolist()
    z = ref.index(family.model.tokenizer.convert_tokens_to_ids("Z"))
    assert ids[:z] == ref[:z] and ids[-(len(ref) - z - 1):] == ref[z + 1:]  # template start and end intact


def test_truncate_runs_a_step_and_counts_the_truncated_prompts(tmp_path, prompt_file):
    # The trainer as it is: the over-long prompt is truncated when its first request is made.
    out = tmp_path / "truncate"
    PPOTrainer(load_config(overrides(tmp_path, prompt_file, "truncate"))).fit()
    (record,) = records(out)
    assert record["response/prompt_truncated_ratio"] == 0.5  # one of the step's two prompts


@pytest.mark.parametrize("mode", ["truncate", "drop"])
def test_fitted_prompts_run_a_step(tmp_path, prompt_file, mode, caplog):
    trainer = PPOTrainer(load_config(overrides(tmp_path, prompt_file, mode)))
    # What the trainer does with its prompts once it calls fit_prompts when they load.
    trainer.sampler.items = trainer.family.fit_prompts(trainer.sampler.items, "data.prompts")
    assert len(trainer.sampler.items) == (2 if mode == "truncate" else 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "prompts are over" in r.getMessage()]
    assert len(warnings) == 1 and "1 of 2 prompts" in warnings[0] and "prompt 1 (" in warnings[0]
    trainer.fit()
    (record,) = records(tmp_path / mode)
    assert record["reward/total/mean"] == record["reward/total/mean"]  # a step ran and was scored

"""What the config points to is checked before any model loads (omni_rl/cli.py check_inputs):
a bad model folder, prompt file, resume path or device ends the run in seconds with one
`error:` line naming the key, exit 2 (1 for weights that cannot be fetched), no traceback.

Each point of the issue runs once through `python main_omni.py` in a subprocess, as a user
would; the variations call `main(argv)` in-process. A test would load the tiny model and train
if a check were missing, so every run also gets its own output folder.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omni_rl import device as device_mod
from omni_rl.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_main_omni(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "main_omni.py", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )


def assert_one_error_line(stderr: str, *expected: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def main_error(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    assert captured.out == ""
    return code, captured.err


@pytest.fixture
def out(tmp_path):
    return f"trainer.output_dir={tmp_path / 'out'}"


# --- 12: model.path --------------------------------------------------------------------------
def test_empty_model_folder(tmp_path, out):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_main_omni(f"model.path={empty}", out)
    assert result.returncode == 2
    assert_one_error_line(result.stderr, f"model.path='{empty}'", "is an empty folder", "model_index.json", "config.json")
    assert result.stdout == ""


def test_broken_model_index(tmp_path, out, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model_index.json").write_text("{garbage")
    code, err = main_error(capsys, f"model.path={folder}", out)
    assert code == 2
    assert_one_error_line(err, f"model.path='{folder}'", f"{folder}/model_index.json is not valid JSON", "re-download")


def test_unreachable_hub_id_says_how_to_get_the_weights(tmp_path, out):
    env = {"HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HUB_OFFLINE": "1"}
    result = run_main_omni("model.path=some-org/some-model", out, env=env)
    assert result.returncode == 1
    assert_one_error_line(
        result.stderr, "model.path='some-org/some-model'", "not in the Hugging Face cache", "HF_HUB_OFFLINE is set",
        "hf download some-org/some-model --local-dir", "model.path=/models/some-model",
    )


# --- 14: prompt files and trainer.resume -------------------------------------------------------
def test_binary_prompt_file(tmp_path, out):
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"a cat\n\x00\xff\xfe\x89")
    result = run_main_omni("data.prompts=null", f"data.prompt_file={path}", out)
    assert result.returncode == 2
    assert_one_error_line(result.stderr, f"data.prompt_file='{path}'", "is not UTF-8 text", "line 2")


@pytest.mark.parametrize("key", ["prompt_file", "val_prompt_file"])
def test_empty_prompt_file(tmp_path, out, capsys, key):
    path = tmp_path / "empty.txt"
    path.write_text("# nothing yet\n")
    inline = "data.prompts=null" if key == "prompt_file" else "data.val_prompts=null"
    code, err = main_error(capsys, inline, f"data.{key}={path}", out)
    assert code == 2
    assert_one_error_line(err, f"data.{key}='{path}': no prompts in {path}")


def test_prompt_file_that_is_a_folder(tmp_path, out, capsys):
    code, err = main_error(capsys, "data.prompts=null", f"data.prompt_file={tmp_path}", out)
    assert code == 2
    assert_one_error_line(err, f"data.prompt_file='{tmp_path}' is a folder, expected a .txt, .jsonl or .parquet file")


def test_resume_path_that_does_not_exist(tmp_path, out):
    result = run_main_omni(f"trainer.resume={tmp_path / 'nope'}", out)
    assert result.returncode == 2
    assert_one_error_line(result.stderr, "trainer.resume=", "no such folder", "checkpoint folder")


def test_resume_path_without_checkpoints(tmp_path, out, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "state.pt").write_bytes(b"x")
    code, err = main_error(capsys, f"trainer.resume={tmp_path / 'run'}", out)
    assert code == 2
    assert_one_error_line(err, f"trainer.resume='{tmp_path / 'run'}': no checkpoint there", "manifest.json")
    code, err = main_error(capsys, f"trainer.resume={tmp_path / 'state.pt'}", out)
    assert code == 2
    assert_one_error_line(err, "is a file; expected a checkpoint folder")


# --- 15: trainer.device --------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_cpu_machine(out):
    result = run_main_omni("trainer.device=cuda", out)
    assert result.returncode == 2
    assert_one_error_line(result.stderr, "trainer.device='cuda'", "no CUDA device is available", "trainer.device=auto", "cpu")


def test_cuda_without_cuda_in_process(monkeypatch, out, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device_mod, "npu_available", lambda: False)
    code, err = main_error(capsys, "trainer.device=cuda:1", out)
    assert code == 2
    assert_one_error_line(err, "trainer.device='cuda:1'", "no CUDA device is available")


# --- image editing: the data and the adapter must be of one kind -------------------------------
def test_an_edit_dataset_on_a_text_to_image_adapter(out):
    result = run_main_omni("recipe=tiny_qwen_image_edit_flowgrpo", "model.adapter=QwenImagePipeline",
                           "model.path=tiny:qwen_image", out)
    assert result.returncode == 2
    assert_one_error_line(result.stderr, "data.prompt_file='recipes/prompts/tiny_edit.jsonl'", "prompt 1",
                          "carries a source image", "model.adapter=QwenImagePipeline", "QwenImageEditPipeline")


def test_a_text_to_image_dataset_on_an_edit_adapter(capsys, out):
    code, err = main_error(capsys, "recipe=tiny_qwen_image_flowgrpo", "model.adapter=QwenImageEditPipeline",
                           "model.path=tiny:qwen_image_edit", out)
    assert code == 2
    assert_one_error_line(err, "data.prompts: prompt 1 ('a cat') has no source image",
                          "model.adapter=QwenImageEditPipeline edits images", "source_image")


def test_an_unreadable_source_image_names_the_row(tmp_path, capsys, out):
    (tmp_path / "ok.png").write_bytes((REPO_ROOT / "recipes/prompts/tiny_edit/navy.png").read_bytes())
    (tmp_path / "broken.png").write_bytes(b"not a png")
    rows = tmp_path / "edits.jsonl"
    rows.write_text('{"instruction": "make it brighter", "source_image": "ok.png"}\n'
                    '{"instruction": "make it darker", "source_image": "broken.png"}\n')
    code, err = main_error(capsys, "recipe=tiny_qwen_image_edit_flowgrpo", f"data.prompt_file={rows}", out)
    assert code == 2
    assert_one_error_line(err, "row 2", "source_image")


@pytest.mark.parametrize("key, value, expected", [
    ("rollout.sampling_options.width", "40", "rollout.sampling_options.width=40: expected a multiple of 16"),
    ("model.adapter_options.condition_image_size", "[32,40]", "model.adapter_options.condition_image_size[1]=40: expected a multiple of 16"),
])
def test_a_size_the_vae_cannot_take(capsys, out, key, value, expected):
    code, err = main_error(capsys, "recipe=tiny_qwen_image_edit_flowgrpo", f"{key}={value}", out)
    assert code == 2
    assert_one_error_line(err, expected, "32 or 48")


# --- issue 29 item 15: rollout.python is checked before the model loads ------------------------
@pytest.mark.parametrize("case, expected", [
    ("missing", "no such file"), ("folder", "is a folder, not a file"), ("not_executable", "is not executable"),
    ("no_interpreter", "cannot run (No such file or directory"), ("bare_name", "no such file on PATH"),
])
def test_a_rollout_python_that_cannot_run_is_one_line_before_loading(tmp_path, capsys, out, case, expected):
    script = tmp_path / "python"
    if case == "folder":
        script.mkdir()
    elif case in ("not_executable", "no_interpreter"):
        script.write_text(f"#!{tmp_path / 'gone' / 'sh'}\nexit 3\n")
        script.chmod(0o755 if case == "no_interpreter" else 0o644)
    path = "no-such-python-3.99" if case == "bare_name" else str(script)
    code, err = main_error(capsys, "rollout.backend=server", f"rollout.backend_options.python={path}", out)
    assert code == 2
    assert_one_error_line(err, f"rollout.backend_options.python='{path}'", expected)
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_rollout_python_that_runs_passes_the_check():
    from omni_rl.rollout.server.interpreter import check_python

    check_python(sys.executable)
    check_python(None)


# --- issue 45 L1: the vLLM paths, one line before the model loads -----------------------------
HAS_VLLM = __import__("importlib.util").util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed in this Python")
def test_a_rollout_python_without_vllm_is_refused_before_the_load(capsys, out, tmp_path):
    # This test's own interpreter has no vllm: the server would start in it and fail after the load.
    code, err = main_error(capsys, "recipe=tiny_qwen3_grpo", "rollout.backend=vllm",
                           f"rollout.backend_options.python={sys.executable}", out)
    assert code == 2
    assert_one_error_line(err, f"rollout.backend_options.python='{sys.executable}' cannot import 'vllm'",
                          "rollout.backend='vllm'", "-m pip install vllm")
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed in this Python")
def test_vllm_in_this_process_without_vllm_is_refused_before_the_load(capsys, out):
    code, err = main_error(capsys, "recipe=tiny_qwen3_grpo", "rollout.backend=vllm", out)
    assert code == 2
    assert_one_error_line(err, "rollout.backend='vllm' needs the 'vllm' package")


def test_a_rollout_python_with_the_packages_passes_the_check():
    from omni_rl.rollout.server.interpreter import check_python

    check_python(sys.executable, packages=(("json", "json"), ("torch", "torch")), backend="vllm")


@pytest.mark.parametrize("recipe, backend, expected", [
    ("tiny_sd3_flowgrpo", "vllm", "rollout.backend='vllm' samples autoregressive models (AutoregressiveModelBase), "
     "and model.adapter='StableDiffusion3Pipeline' is a diffusion model (StableDiffusion3Adapter); use one of the "
     "backends that sample it: native, server, vllm_omni"),
    ("tiny_qwen3_grpo", "vllm_omni", "rollout.backend='vllm_omni' samples diffusion models (DiffusionModelBase)"),
])
def test_a_backend_for_another_family_is_refused_at_load(capsys, out, recipe, backend, expected):
    # Found when the config composes (--cfg too), not as a TypeError after the model load.
    code, err = main_error(capsys, "--cfg", f"recipe={recipe}", f"rollout.backend={backend}", out)
    assert code == 2
    assert_one_error_line(err, expected)


@pytest.mark.parametrize("recipe, stage, expected", [
    ("tiny_flux_flowgrpo", "thinker", "model.adapter=FluxPipeline has no such stage (it has no stages"),
    ("tiny_bagel_flowgrpo", "talker", "model.adapter=BagelForConditionalGeneration has no such stage (its stages: edit, think, or null)"),
])
def test_a_stage_the_adapter_has_not_says_so(capsys, out, recipe, stage, expected):
    code, err = main_error(capsys, f"recipe={recipe}", f"model.stage={stage}", out)
    assert code == 2
    assert_one_error_line(err, f"model.stage='{stage}'", expected)


@pytest.mark.parametrize("row, expected", [
    ({"instruction": "make it brighter", "metadata": {"brightness_direction": "up"}},
     "edit_brightness: metadata[1]['brightness_direction'] is 'up'; expected +1 (brighter) or -1 (darker)"),
    ({"instruction": "make it blue"}, "edit_brightness: prompt 1 ('make it blue') says neither"),
])
def test_edit_rows_the_reward_cannot_score_are_refused_at_load(tmp_path, capsys, out, row, expected):
    import json

    (tmp_path / "navy.png").write_bytes((REPO_ROOT / "recipes/prompts/tiny_edit/navy.png").read_bytes())
    rows = tmp_path / "edits.jsonl"
    good = {"instruction": "make it darker", "source_image": "navy.png"}
    rows.write_text(json.dumps(good) + "\n" + json.dumps({**row, "source_image": "navy.png"}) + "\n")
    code, err = main_error(capsys, "recipe=tiny_qwen_image_edit_flowgrpo", f"data.prompt_file={rows}", out)
    assert code == 2
    assert_one_error_line(err, f"data.prompt_file='{rows}'", expected)


# --- issue 38, part 3: real data as the peers ship it, checked before any model loads ------------
def test_a_caption_file_on_the_ocr_recipe_names_its_first_line_without_a_target(capsys, out):
    from tests.shared_data import shared_dataset

    # Flow-GRPO's PickScore captions hold no quoted text for the ocr reward to read.
    captions = shared_dataset("flow_grpo/pickscore/test.txt")
    code, err = main_error(capsys, "recipe=tiny_sd3_flowgrpo_ocr", f"data.prompt_file={captions}", out)
    assert code == 2
    assert_one_error_line(err, f"data.prompt_file='{captions}': line 1: reward.rewards[0]: reward 'ocr' cannot "
                          f"score this prompt: it has no target text", "contains no quoted text")


def test_flow_grpo_ocr_prompts_pass_the_ocr_check():
    from omni_rl.reward.prompt_checks import check_items as _check_items
    from omni_rl.data.prompts import read_prompt_file
    from rewards.ocr import check_ocr_item
    from tests.shared_data import shared_dataset

    items = read_prompt_file(str(shared_dataset("flow_grpo/ocr/test.txt")))
    assert len(items) == 1018
    _check_items("reward.rewards[0]", "ocr", check_ocr_item, "data.prompt_file", items)  # every one has a quoted target


def test_math_answer_rows_without_an_answer_name_their_row(tmp_path, capsys, out):
    rows = tmp_path / "q.jsonl"
    rows.write_text('{"prompt": "1+1?", "ground_truth": "2"}\n{"prompt": "2+2?", "reward_model": {"style": "rule"}}\n')
    code, err = main_error(capsys, "recipe=tiny_qwen3_omni_gspo", f"data.prompt_file={rows}",
                           "reward.rewards=[{name: math_answer}]", out)
    assert code == 2
    assert_one_error_line(err, f"data.prompt_file='{rows}': row 2: reward.rewards[0]: reward 'math_answer' cannot "
                          f"score this prompt: it has no reference answer: its metadata has no 'ground_truth'")


def test_a_caption_outside_the_shape_grammar_names_its_line(tmp_path, capsys, out):
    rows = tmp_path / "shapes.jsonl"
    rows.write_text('{"prompt": "a photo of a red circle"}\n{"prompt": "a photo of a bench"}\n')
    code, err = main_error(capsys, "recipe=tiny_sd3_shapes_geneval", f"data.prompt_file={rows}", out)
    assert code == 2
    assert_one_error_line(err, f"data.prompt_file='{rows}': line 2: reward.rewards[0]: reward 'geneval_shapes' "
                          f"cannot score this prompt: it has no scene to check: caption 'a photo of a bench'")


def test_prompt_image_rows_on_a_text_to_image_recipe_are_refused(tmp_path, capsys, out):
    # Flow-Factory's / verl-omni's {"prompt", "image"} rows are image-conditioned, not captions.
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "navy.png").write_bytes((REPO_ROOT / "recipes/prompts/tiny_edit/navy.png").read_bytes())
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"prompt": "make it brighter", "image": "navy.png"}\n')
    code, err = main_error(capsys, "recipe=tiny_qwen_image_flowgrpo", f"data.prompt_file={rows}", out)
    assert code == 2
    assert_one_error_line(err, f"data.prompt_file='{rows}': prompt 1 ('make it brighter') carries a source image",
                          "model.adapter=QwenImagePipeline makes images from text")


def test_a_chat_file_with_images_on_an_edit_recipe_is_refused_before_the_edit_rewards(tmp_path, capsys, out):
    import base64

    png = base64.b64encode((REPO_ROOT / "recipes/prompts/tiny_edit/navy.png").read_bytes()).decode()
    rows = tmp_path / "chat.jsonl"
    rows.write_text('{"prompt": "make it brighter", "images": ["%s"]}\n' % png)
    code, err = main_error(capsys, "recipe=tiny_qwen_image_edit_flowgrpo", f"data.prompt_file={rows}", out)
    assert code == 2
    assert_one_error_line(err, f"data.prompt_file='{rows}': row 1: reward.rewards[0]: reward 'edit_brightness' "
                          f"cannot score this prompt: it has no source image")


@pytest.mark.parametrize("recipe, file_key, list_key", [("tiny_sd3_flowgrpo", "data.prompt_file", "data.prompts"),
                                                        ("tiny_sd3_shapes_counting", "data.val_prompt_file", "data.val_prompts")])
def test_a_prompt_file_on_the_command_line_replaces_the_recipes_inline_list(tmp_path, capsys, recipe, file_key, list_key):
    from omni_rl.compose import load_config
    from omni_rl.data.prompts import training_prompt_items, validation_prompt_items

    prompts = tmp_path / "mine.txt"
    prompts.write_text("two red circles\na blue square\n")
    assert getattr(load_config([f"recipe={recipe}"]).data, list_key.split(".")[1]) is not None  # listed inline
    cfg = load_config([f"recipe={recipe}", f"{file_key}={prompts}"])
    read = training_prompt_items if file_key == "data.prompt_file" else validation_prompt_items
    assert [item.prompt for item in read(cfg.data)] == ["two red circles", "a blue square"]
    # Both on the command line: one error line, exit 2, before anything loads.
    code, err = main_error(capsys, f"recipe={recipe}", f"{file_key}={prompts}", f"{list_key}=[a cat]")
    assert code == 2
    assert_one_error_line(err, f"{file_key}={prompts} and {list_key}=[a cat] are both given on the command line")


def test_plan_reads_the_data_when_it_is_here(tmp_path, capsys):
    rows = tmp_path / "captions.txt"
    rows.write_text("a photo of a cat\n")
    code, err = main_error(capsys, "recipe=tiny_sd3_flowgrpo_ocr", f"data.prompt_file={rows}",
                           f"trainer.output_dir={tmp_path / 'out'}", "--plan")
    assert code == 2
    assert_one_error_line(err, f"data.prompt_file='{rows}': line 1: reward.rewards[0]: reward 'ocr' cannot score")
    assert not (tmp_path / "out" / "plan.json").exists()


# --- issue 45 L2: the talker's frames within its positions -----------------------------------
@pytest.mark.parametrize("built", [True, False], ids=["on-disk", "built-on-first-use"])
def test_more_talker_frames_than_its_positions_is_one_line_before_sampling(out, tmp_path, built):
    # The tiny talker's config gives its talker 32768 positions; a frame is one of them. On disk
    # the check runs before the load; a tiny model built on first use is checked once built.
    from omni_rl.models.loading import resolve_model_path

    env = {} if built else {"OMNI_RL_CACHE": str(tmp_path / "fresh_cache")}
    if built:
        resolve_model_path("tiny:qwen3_omni_talker")
    result = run_main_omni("recipe=tiny_qwen3_omni_talker_grpo", "rollout.sampling_options.max_frames=100000000", out,
                           env=env)
    assert result.returncode == 2, result.stderr
    assert_one_error_line(result.stderr, "rollout.sampling_options.max_frames=100000000", "32768 positions",
                          "max_position_embeddings", "set at most 32768")

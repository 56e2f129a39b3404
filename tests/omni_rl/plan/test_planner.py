"""`--plan`'s trace and verdict: the fake-tensor trace equals the same trace on real tensors,
bad input is one line and exit 2, and every real recipe plans with no weights and no network."""
import json

import pytest
from omegaconf import OmegaConf

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.config import available_recipes
from omni_rl.config.loader import PROJECT_ROOT
from omni_rl.plan.architecture import architecture_folder
from omni_rl.plan.planner import _spec, make_plan
from omni_rl.plan.steps import trace_step
from omni_rl.plan.weights import build_weightless, weights_of

# Tiny recipes whose adapters register a traced forward (SD3, Qwen-Image, Qwen-Image-Edit, Wan, LTX-2, Z-Image,
# FLUX.1, FLUX.1-Kontext, FLUX.2, BAGEL).
TRACED_TINY = ["tiny_sd3_flowgrpo", "tiny_qwen_image_flowgrpo", "tiny_qwen_image_edit_flowgrpo", "tiny_wan22_flowgrpo",
               "tiny_ltx2_flowgrpo_av", "tiny_z_image_flowgrpo", "tiny_flux_flowgrpo", "tiny_flux_kontext_flowgrpo",
               "tiny_flux2_flowgrpo", "tiny_bagel_flowgrpo", "tiny_minimax_h3_flowgrpo"]


def real_recipes() -> list[str]:
    out = []
    for name, file in sorted(available_recipes().items()):
        if file.parent == PROJECT_ROOT / "recipes" and not str(OmegaConf.load(file).model.path).startswith("tiny:"):
            out.append(name)
    return out


@pytest.mark.parametrize("recipe", TRACED_TINY)
def test_fake_trace_equals_the_real_tensor_trace(recipe, tmp_path):
    cfg = load_config([f"recipe={recipe}", f"trainer.output_dir={tmp_path}"])
    folder = architecture_folder(cfg.model.path)
    fake_built, real_built = build_weightless(cfg, folder), build_weightless(cfg, folder)
    # Weights, gradients, optimizer state: the same arithmetic on the same shapes, exactly.
    assert weights_of(cfg, folder, fake_built)["per_device_bytes"] == weights_of(cfg, folder, real_built)["per_device_bytes"]
    fake = trace_step(fake_built.model, _spec(cfg), cfg, fake=True)
    real = trace_step(real_built.model, _spec(cfg), cfg, fake=False)
    assert fake.rollout.flops == real.rollout.flops > 0
    assert fake.train.flops == real.train.flops > 0
    for f, r in ((fake.rollout, real.rollout), (fake.train, real.train)):
        assert r.activation_bytes > 0
        assert abs(f.activation_bytes - r.activation_bytes) <= 0.05 * r.activation_bytes, (f, r)


def test_a_smaller_device_lists_the_knobs_that_fit(tmp_path):
    cfg = load_config(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={tmp_path}"])
    plan = make_plan(cfg, "H800", 0.0001)  # 100 kB: nothing fits
    verdict = plan["verdict"]
    assert not verdict["fits"] and verdict["knobs"]
    by_knob = {k["knob"]: k for k in verdict["knobs"]}
    # Halving the rollout batch shrinks the rollout forward's activations (re-planned, not guessed).
    half = by_knob[f"rollout.max_num_seqs={cfg.rollout.max_num_seqs // 2}"]
    assert half["peak_bytes"] <= verdict["peak_bytes"]


@pytest.mark.parametrize("flag, message", [
    (["--device-kind", "B300"], "error: --device-kind='B300': unknown device kind"),
    (["--device-memory", "-5"], "error: --device-memory='-5': expected a positive number"),
    (["--device-memory=lots"], "error: --device-memory='lots': expected a positive number"),
])
def test_bad_device_options_are_one_line(flag, message, tmp_path, capsys):
    assert main(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={tmp_path}", "--plan", *flag]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("flag", [["--device-memory", "inf"], ["--device-memory=1e400"], ["--device-memory", "-inf"]])
def test_an_infinite_device_memory_is_one_line(flag, tmp_path, capsys):
    # issue 45 L4: inf overflowed the byte count (a 20-line OverflowError).
    assert main(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={tmp_path}", "--plan", *flag]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device-memory=") and "expected a positive number of GB (finite" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("other", [["--cfg"], ["--eval", "shapes_counting"]])
def test_plan_with_another_mode_is_one_line(other, tmp_path, capsys):
    # issue 45 L4: --plan --cfg printed the config and dropped --plan without a word.
    assert main(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={tmp_path}", "--plan", *other]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"error: {other[0]} and --plan do not combine") or \
        captured.err.startswith(f"error: --plan and {other[0]} do not combine"), captured.err
    assert captured.err.count("\n") == 1
    assert not (tmp_path / "plan.json").exists()


def test_a_file_as_the_plans_output_dir_is_one_line(tmp_path, capsys):
    # issue 45 L4: 45 lines ending in FileExistsError.
    file = tmp_path / "a_file"
    file.write_text("not a folder")
    assert main(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={file}", "--plan"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: trainer.output_dir='{file}' is a file; expected a folder (choose another trainer.output_dir or move the file)\n"
    assert file.read_text() == "not a folder"


def test_a_plan_into_another_runs_folder_is_refused(tmp_path, capsys):
    # issue 45 L4: plan.json landed among another run's checkpoints, with no check and no lock.
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={run}", "--plan"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: trainer.output_dir='{run}' holds another run (metrics.jsonl, checkpoints") and \
        err.count("\n") == 1, err
    assert "set trainer.output_dir to a new folder" in err
    assert not (run / "plan.json").exists()


def test_a_plan_into_a_folder_a_run_holds_is_refused(tmp_path, capsys):
    from omni_rl.trainer.run_dir import check_output_dir, hold

    held = hold(check_output_dir(str(tmp_path / "busy")))  # another run, running
    try:
        assert main(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={held.path}", "--plan"]) == 2
    finally:
        held.release()
    err = capsys.readouterr().err
    assert err.startswith(f"error: trainer.output_dir='{held.path}' is in use by another run (pid "), err
    assert not (held.path / "plan.json").exists()


def test_a_plan_writes_into_a_free_folder_and_lets_a_run_follow(tmp_path, capsys):
    from omni_rl.trainer.run_dir import check_output_dir, hold, previous_run

    assert main(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={tmp_path}", "--plan"]) == 0
    assert json.loads((tmp_path / "plan.json").read_text())["verdict"]["device_kind"] == "H800"
    held = hold(check_output_dir(str(tmp_path)))  # the plan let go of the folder, and left no run in it
    assert previous_run(tmp_path) is None
    held.release()


def test_a_recipe_without_an_architecture_folder_is_one_line(tmp_path, capsys):
    code = main(["recipe=sd35_medium_flowgrpo_lora", "model.path=nobody/nothing", f"trainer.output_dir={tmp_path}", "--plan"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: model.path='nobody/nothing'") and err.count("\n") == 1


# Real recipes whose model (path and stage) another real recipe in the default run plans at full
# size too: they differ in rewards, batch or teachers, which the tiny plans check.
SAME_MODEL_PLANNED = {
    "bagel_flowgrpo_ocr_pickscore_lora", "flux1_dev_flowgrpo_pickscore_lora", "qwen_image_flowgrpo_ocr_lora",
    "sd35_medium_flowgrpo_ocr_lora", "sd35_medium_flowgrpo_pickscore_lora", "sd35_medium_flowgrpo_geneval_lora",
    "sd35_medium_distill_ocr_lora", "qwen3_omni_thinker_distill_lora_mmk12",
}
# Full-size plans that took over 15 s each on a quiet 2-core machine (seconds measured there: a
# fake-tensor trace of every block, forward and backward). The default run keeps the quicker ones
# (an image model with two teachers, a video model, the MoE thinker whose rollout is memory-bound,
# BAGEL, FLUX.2, the talkers, HunyuanVideo) to stay within CI's 30 minutes; these are planned by
# `python -m pytest -m long` and by `benchmarks/plan_table.py` (docs/plan.md's table).
SLOW_FULL_PLANS = {
    "ltx23_flowgrpo_clap_imagebind_lora": 125, "qwen_image_edit_flowgrpo_lora": 51,
    "wan22_t2v_a14b_dancegrpo_lora": 46, "minimax_h3_t2va_flowgrpo_lora": 38, "qwen_image_flow_dppo_lora": 35,
    "flux1_kontext_flowgrpo_lora": 26, "flux1_dev_dancegrpo_hps_lora": 22, "z_image_turbo_flowgrpo_lora": 16,
    "sd35_medium_flowgrpo_lora": 16,
}
PLANNED_IN_LONG = SAME_MODEL_PLANNED | set(SLOW_FULL_PLANS)


def _model_of(recipe: str) -> tuple[str, object]:
    model = OmegaConf.load(available_recipes()[recipe]).model
    return str(model.path), model.get("stage")


def test_every_real_model_is_planned_in_the_default_run_unless_its_plans_are_slow():
    assert PLANNED_IN_LONG <= set(real_recipes())
    default = {_model_of(r) for r in real_recipes() if r not in PLANNED_IN_LONG}
    slow = {_model_of(r) for r in SLOW_FULL_PLANS}
    assert {_model_of(r) for r in SAME_MODEL_PLANNED} <= default | slow
    assert len(default) >= 5  # an image, a video and a text model at least, besides the slow ones


@pytest.mark.parametrize("recipe", [
    pytest.param(r, marks=pytest.mark.long) if r in PLANNED_IN_LONG else r for r in real_recipes()])
def test_every_real_recipe_plans_without_weights(recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # A memory nothing exceeds: the knobs are not re-planned (that is checked on the tiny model),
    # so each recipe is built and traced once at its full size.
    assert main([f"recipe={recipe}", f"trainer.output_dir={tmp_path}", "--plan", "--device-memory", "1e9"]) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["parameters"]["total"] > 1e9 and plan["parameters"]["trainable"] > 0
    assert plan["peaks"]["training"] >= plan["per_device_bytes"]["device_total"]
    # The driver's build is weightless: it materialised nothing (a Ray driver holds no weights).
    assert plan["driver"]["bytes"]["policy_weights"] == 0
    if "roofline" in plan:  # a traced recipe: every phase names its bound
        assert {plan["roofline"][p]["bound"] for p in ("rollout", "update")} <= {"compute", "memory"}
        # Decoding reads the active experts' weights and the KV cache every token: memory-bound.
        if recipe.startswith("qwen3_omni_thinker_gspo"):
            assert plan["roofline"]["rollout"]["bound"] == "memory"


# Text recipes, traced through the adapter's forward_logits with the KV cache (text_steps.py); the
# Qwen3-Omni thinker in bf16, because the fake kernel of its grouped MoE experts takes bf16 only.
TRACED_TEXT = [("tiny_qwen3_grpo", []), ("tiny_qwen3_omni_gspo", ["model.dtype=bfloat16"])]


@pytest.mark.parametrize("recipe, extra", TRACED_TEXT)
def test_the_text_fake_trace_equals_the_real_tensor_trace(recipe, extra, tmp_path):
    from omni_rl.plan.text_steps import trace_text_step

    cfg = load_config([f"recipe={recipe}", f"trainer.output_dir={tmp_path}", "algo.family_options.max_prompt_tokens=24",
                       "rollout.sampling_options.max_new_tokens=8", "rollout.max_num_seqs=4", "trainer.micro_batch_size=2", *extra])
    folder = architecture_folder(cfg.model.path)
    fake = trace_text_step(build_weightless(cfg, folder).model, _spec(cfg), cfg, fake=True)
    real = trace_text_step(build_weightless(cfg, folder).model, _spec(cfg), cfg, fake=False)
    assert fake.rollout.flops == real.rollout.flops > 0
    assert fake.train.flops == real.train.flops > 0
    for f, r in ((fake.rollout, real.rollout), (fake.train, real.train)):
        assert r.activation_bytes > 0
        assert abs(f.activation_bytes - r.activation_bytes) <= 0.05 * r.activation_bytes, (f, r)


def test_the_rollout_trace_holds_the_whole_cache_at_the_last_step(tmp_path):
    """A longer response grows the decoding peak by its cache: the last step holds P + R tokens."""
    from omni_rl.plan.text_steps import trace_text_step

    peaks = []
    for response in (8, 64):
        cfg = load_config(["recipe=tiny_qwen3_grpo", f"trainer.output_dir={tmp_path}", "algo.family_options.max_prompt_tokens=4",
                           f"rollout.sampling_options.max_new_tokens={response}", "rollout.max_num_seqs=4"])
        step = trace_text_step(build_weightless(cfg, architecture_folder(cfg.model.path)).model, _spec(cfg), cfg)
        peaks.append(step.rollout.activation_bytes)
    assert peaks[1] > peaks[0]


def test_a_text_plan_without_a_prompt_budget_is_refused(tmp_path):
    from omni_rl.plan.text_steps import text_lengths

    cfg = load_config(["recipe=tiny_qwen3_grpo", f"trainer.output_dir={tmp_path}", "algo.family_options.max_prompt_tokens=null"])
    with pytest.raises(ValueError, match="max_prompt_tokens=None"):
        text_lengths(cfg)

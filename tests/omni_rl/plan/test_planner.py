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
               "tiny_flux2_flowgrpo", "tiny_bagel_flowgrpo"]


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


def test_a_recipe_without_an_architecture_folder_is_one_line(tmp_path, capsys):
    code = main(["recipe=sd35_medium_flowgrpo_lora", "model.path=nobody/nothing", f"trainer.output_dir={tmp_path}", "--plan"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: model.path='nobody/nothing'") and err.count("\n") == 1


# About 150 s for all twelve on a 2-core CI machine (the trained networks traced at full size).
@pytest.mark.parametrize("recipe", real_recipes())
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


# Text recipes, traced through the adapter's forward_logits with the KV cache (text_steps.py); the
# Qwen3-Omni thinker in bf16, because the fake kernel of its grouped MoE experts takes bf16 only.
TRACED_TEXT = [("tiny_qwen3_grpo", []), ("tiny_qwen3_omni_gspo", ["model.dtype=bfloat16"])]


@pytest.mark.parametrize("recipe, extra", TRACED_TEXT)
def test_the_text_fake_trace_equals_the_real_tensor_trace(recipe, extra, tmp_path):
    from omni_rl.plan.text_steps import trace_text_step

    cfg = load_config([f"recipe={recipe}", f"trainer.output_dir={tmp_path}", "algo.family_options.max_prompt_tokens=24",
                       "algo.family_options.max_new_tokens=8", "rollout.max_num_seqs=4", "trainer.micro_batch_size=2", *extra])
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
                           f"algo.family_options.max_new_tokens={response}", "rollout.max_num_seqs=4"])
        step = trace_text_step(build_weightless(cfg, architecture_folder(cfg.model.path)).model, _spec(cfg), cfg)
        peaks.append(step.rollout.activation_bytes)
    assert peaks[1] > peaks[0]


def test_a_text_plan_without_a_prompt_budget_is_refused(tmp_path):
    from omni_rl.plan.text_steps import text_lengths

    cfg = load_config(["recipe=tiny_qwen3_grpo", f"trainer.output_dir={tmp_path}", "algo.family_options.max_prompt_tokens=null"])
    with pytest.raises(ValueError, match="max_prompt_tokens=None"):
        text_lengths(cfg)

"""The tiny BAGEL recipes train end to end, in a subprocess as a user runs them: the rollout's and the
trainer's log-probs are the same function (first mini-batch ratio 1, <= 1e-5 apart), the LoRA is
left in PEFT's format, and over each recipe's whole run (`slow`; the text-to-image one is BAGEL's in
the default run, the edit and think ones `long`) the mean reward of the last 20% of steps beats
the first 20% by more than 3 standard errors (`rise_report`). The editing recipe
(`tiny_bagel_edit_flowgrpo`, `model.stage=edit`) runs 2 steps here and leaves validation grids whose
rows start with the source image. The think-then-draw recipe (`tiny_bagel_think_flowgrpo`,
`model.stage=think`) runs 2 steps here: one trajectory of plan tokens and image steps, on-policy
on both, its validation records carrying each greedy plan."""
import json
from pathlib import Path

import pytest
from PIL import Image

from omni_rl.compose import load_config
from omni_rl.config.loader import PROJECT_ROOT
from omni_rl.logging import rise_report
from tests.recipes.recipe_runs import train

# The official paths a BAGEL recipe cites (ByteDance-Seed/Bagel), as they call the sampler:
# inference.ipynb's image generation and think cells pass cfg_text_scale 4.0, cfg_img_scale 1.0,
# cfg_interval [0.4, 1.0], timestep_shift 3.0, cfg_renorm_min 0.0, cfg_renorm_type "global";
# eval/gen/gedit/gen_images_gedit.py calls it with 4.0, 1.5, [0.4, 1.0], 3.0, 0.0, "text_channel".
NOTEBOOK = dict(guidance_scale=4.0, cfg_interval=[0.4, 1.0], timestep_shift=3.0, cfg_renorm_min=0.0,
                cfg_renorm_type="global", image_guidance_scale=1.0, plan_guidance_scale=1.0)
GEDIT = dict(guidance_scale=4.0, cfg_interval=[0.4, 1.0], timestep_shift=3.0, cfg_renorm_min=0.0,
             cfg_renorm_type="text_channel", image_guidance_scale=1.5, plan_guidance_scale=1.0)
CITED = {  # recipe: (the words its comment cites the path by, the path's settings)
    "bagel_flowgrpo_ocr_pickscore_lora": ("inference notebook", NOTEBOOK),
    "bagel_flowgrpo_ocr_pickscore_full": ("inference notebook", NOTEBOOK),
    "tiny_bagel_flowgrpo": ("inference notebook", NOTEBOOK),
    "tiny_bagel_think_flowgrpo": ("inference notebook's think", NOTEBOOK),
    "tiny_bagel_edit_flowgrpo": ("GEdit evaluation", GEDIT),
}


@pytest.mark.parametrize("recipe", sorted(CITED))
def test_each_bagel_recipe_samples_as_the_official_path_it_cites(recipe):
    words, official = CITED[recipe]
    assert words in (PROJECT_ROOT / "recipes" / f"{recipe}.yaml").read_text().replace("\n#", "")
    cfg = load_config([f"recipe={recipe}"])
    options = cfg.model.adapter_options
    have = {k: getattr(options, k) for k in official if k != "guidance_scale"}
    have["cfg_interval"] = list(have["cfg_interval"])
    assert {**have, "guidance_scale": cfg.rollout.sampling_options.guidance_scale} == official


def run(out: Path, recipe: str, *overrides: str) -> list[dict]:
    steps = train(out, recipe, *overrides)
    assert (out / "lora" / "adapter_model.safetensors").is_file()
    assert (out / "lora" / "adapter_config.json").is_file()
    return steps


def test_tiny_bagel_edit_flowgrpo_trains(tmp_path):
    out = tmp_path / "bagel_edit"
    steps = run(out, "tiny_bagel_edit_flowgrpo", "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2")
    assert len(steps) == 2
    grid = Image.open(out / "samples" / "val_step_000002.png")
    assert grid.width > grid.height  # rows of a source and its edits


@pytest.mark.slow
@pytest.mark.parametrize("recipe, total_steps", [
    ("tiny_bagel_flowgrpo", 40),  # BAGEL's whole learning run in the default run
    pytest.param("tiny_bagel_edit_flowgrpo", 50, marks=pytest.mark.long),
    pytest.param("tiny_bagel_think_flowgrpo", 40, marks=pytest.mark.long),
])
def test_the_whole_recipe_learns(tmp_path, recipe, total_steps):
    out = tmp_path / recipe
    assert len(run(out, recipe)) == total_steps
    report = rise_report(out / "metrics.jsonl")
    assert report["rose"], report


def test_tiny_bagel_think_flowgrpo_trains(tmp_path):
    out = tmp_path / "bagel_think"
    steps = run(out, "tiny_bagel_think_flowgrpo", "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2")
    assert len(steps) == 2
    assert all(0 < r["response/plan_length_mean"] <= 8 for r in steps)
    assert all("loss/plan_policy_loss" in r for r in steps)
    records = [json.loads(line) for line in (out / "samples" / "val_step_000002.jsonl").read_text().splitlines()]
    assert len(records) == 16 and all(isinstance(r["plan"], str) for r in records)
    assert (out / "samples" / "val_step_000002.png").is_file()


@pytest.mark.long  # CI time: the think-then-draw path trains by default in test_tiny_bagel_think_flowgrpo_trains
def test_tiny_bagel_think_with_cfg_toward_the_plan_trains_on_policy(tmp_path):
    """The official think mode's default second guidance (plan_guidance_scale 1.5): its plan-free
    context travels with each sample, so the trainer replays the rollout's velocity exactly."""
    steps = run(tmp_path / "bagel_think_cfg", "tiny_bagel_think_flowgrpo", "model.adapter_options.plan_guidance_scale=1.5",
                "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2")
    assert len(steps) == 2

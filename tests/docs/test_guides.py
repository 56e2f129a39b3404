"""The guides of docs/extending/ followed as written, as a newcomer would.

A fenced block that follows a `<!-- guide-file: PATH -->` line is the whole file PATH of the
guide's example. Each test copies the packages the guide adds to (`rewards/`, `adapters/`) into
a scratch folder, writes the guide's files there, and runs in a fresh Python with that folder
first on the path: the copy's package shadows the project's, so "a new file in `rewards/`" is
tested as a new file in `rewards/`, and the registries of this session are left alone. A YAML
block named `recipe.yaml` holds the lines the guide adds to a recipe: they are added to a copy
of the default recipe (`recipe_with`), which `load_config` composes.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GUIDES = ROOT / "docs" / "extending"
GUIDE_FILE = re.compile(r"^<!--\s*guide-file:\s*(?P<path>\S+)\s*-->\n```\w*\n(?P<code>.*?)^```", re.M | re.S)


def guide_files(guide: str) -> dict[str, str]:
    """{path: text} of the guide's example files, in the order the guide shows them."""
    found = {m["path"]: m["code"] for m in GUIDE_FILE.finditer((GUIDES / guide).read_text())}
    assert found, f"docs/extending/{guide} shows no `<!-- guide-file: PATH -->` block"
    return found


def recipe_with(block: str) -> dict:
    """The default recipe with the guide's lines added: each key of a section of the block
    replaces the recipe's (`model.adapter_options` the whole block), as in a recipe of one's own."""
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny_sd3_flowgrpo.yaml").read_text())
    for section, value in yaml.safe_load(block).items():
        if isinstance(value, dict):
            recipe.setdefault(section, {}).update(value)
        else:
            recipe[section] = value
    return recipe


def follow(tmp_path: Path, guide: str, packages: tuple[str, ...], script: str) -> str:
    """Write the guide's files into a copy of `packages` under tmp_path and run `script` there
    (`GUIDE_OVERRIDES`: `recipe=` the guide's recipe); return its stdout."""
    for package in packages:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    files = guide_files(guide)
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(yaml.safe_dump(recipe_with(text)) if path == "recipe.yaml" else text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the scratch folder is the guide's tests' root
    recipe = [f"recipe={tmp_path / 'recipe.yaml'}"] if "recipe.yaml" in files else []
    setup = f"GUIDE_OVERRIDES = {recipe!r}\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", setup + script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"following docs/extending/{guide}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def pytest_in(tmp_path: Path, test_file: str) -> str:
    """Run pytest on one of the guide's test files; the script line that does it."""
    return (f"import pytest, sys\ncode = pytest.main([{test_file!r}, '-q', '-p', 'no:cacheprovider', "
            f"'-c', 'pytest.ini'])\nassert code == 0, f'the guide\\'s test failed: exit {{code}}'\n")


def test_the_reward_guide(tmp_path):
    out = follow(tmp_path, "reward.md", ("rewards",), f"""
import rewards
from omni_rl.compose import load_config
from omni_rl.reward import REWARDS, build_reward
assert REWARDS.get("redness").__module__ == "rewards.redness", REWARDS.get("redness").__module__
assert "redness" not in rewards.HELPERS
cfg = load_config(GUIDE_OVERRIDES)
assert [(r.name, r.reward_options) for r in cfg.reward.rewards] == [("redness", {{"channel": 0}})], cfg.reward.rewards
{pytest_in(tmp_path, "tests/rewards/test_redness_reward.py")}
print("followed")
""")
    assert "followed" in out


def test_the_loss_guide(tmp_path):
    out = follow(tmp_path, "loss.md", (), f"""
import importlib.util
from omni_rl.algos import DIFFUSION_LOSSES
from omni_rl.compose import load_config
cfg = load_config(GUIDE_OVERRIDES)
assert cfg.algo.policy_loss == "clipped_step"
from my_losses import MyClippedLoss
assert DIFFUSION_LOSSES.get("clipped_step") is MyClippedLoss
# The contract every registered loss meets (tests/omni_rl/algos/test_rollout_correction.py).
spec = importlib.util.spec_from_file_location("contract", {str(ROOT / "tests/omni_rl/algos/test_rollout_correction.py")!r})
contract = importlib.util.module_from_spec(spec)
spec.loader.exec_module(contract)
contract.check_rollout_correction(MyClippedLoss)
{pytest_in(tmp_path, "tests/test_clipped_step.py")}
print("followed")
""")
    assert "followed" in out


def test_the_rollout_backend_guide(tmp_path):
    out = follow(tmp_path, "rollout-backend.md", (), """
from omni_rl.compose import load_config
from omni_rl.rollout.backends import ROLLOUT_BACKENDS, build_rollout_engine
cfg = load_config(GUIDE_OVERRIDES)
assert cfg.rollout.backend == "my_engine"
import my_engine
spec = ROLLOUT_BACKENDS.get("my_engine")
assert spec.options_class is my_engine.MyEngineOptions
engine = build_rollout_engine(cfg, model=object())
assert isinstance(engine, my_engine.MyEngine) and engine.options.max_batch == 32, vars(engine)
assert not engine.shares_model_with(engine.trainer_adapter)  # it samples with weights of its own
engine.update_weights({}, 3, "lora")
assert engine.weight_version == 3
print("followed")
""")
    assert "followed" in out


def test_the_adapter_guide(tmp_path):
    out = follow(tmp_path, "adapter.md", ("adapters",), f"""
import runpy, sys
import adapters
from omni_rl.compose import load_config
from omni_rl.models.registry import ADAPTERS
adapter = ADAPTERS.get("MyFlowPipeline")
assert adapter.__module__ == "adapters.my_flow", adapter.__module__
cfg = load_config(GUIDE_OVERRIDES)
assert type(cfg.model.adapter_options) is adapter.options_class and cfg.model.adapter_options.guidance_rescale == 0.7
# `--options model.adapter=MyFlowPipeline` prints the options with their defaults and docs.
sys.argv = ["main_omni.py", "--options", "model.adapter=MyFlowPipeline"]
try:
    runpy.run_path({str(ROOT / "main_omni.py")!r}, run_name="__main__")
except SystemExit as stop:
    assert not stop.code, stop.code
print("followed")
""")
    assert "followed" in out and "guidance_rescale" in out and "Rescale the CFG output" in out, out

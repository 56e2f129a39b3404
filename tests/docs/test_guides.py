"""The guides of docs/extending/ followed as written, as a newcomer would.

A fenced block that follows a `<!-- guide-file: PATH -->` line is the whole file PATH of the
guide's example. Each test copies the packages the guide adds to (`rewards/`, `adapters/`) into
a scratch folder, writes the guide's files there, and runs in a fresh Python with that folder
first on the path: the copy's package shadows the project's, so "a new file in `rewards/`" is
tested as a new file in `rewards/`, and the registries of this session are left alone. A YAML
block named `recipe.yaml` is composed (`load_config`) as overrides of the default recipe.
"""
from __future__ import annotations

import json
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


def overrides(block: str) -> list[str]:
    """A recipe fragment as Hydra overrides (`a.b=value`)."""

    def literal(value) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {literal(v)}" for k, v in value.items()) + "}"
        if isinstance(value, list):
            return "[" + ", ".join(literal(v) for v in value) + "]"
        return json.dumps(value) if isinstance(value, str) else repr(value)

    def flat(prefix: str, value) -> list[str]:
        if isinstance(value, dict) and value:
            return [o for k, v in value.items() for o in flat(f"{prefix}.{k}" if prefix else k, v)]
        return [f"{prefix}={literal(value)}"]

    return flat("", yaml.safe_load(block))


def follow(tmp_path: Path, guide: str, packages: tuple[str, ...], script: str) -> str:
    """Write the guide's files into a copy of `packages` under tmp_path and run `script` there
    (`GUIDE_OVERRIDES` holds the recipe block's overrides); return its stdout."""
    for package in packages:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    files = guide_files(guide)
    for path, text in files.items():
        if path != "recipe.yaml":
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the scratch folder is the guide's tests' root
    setup = f"GUIDE_OVERRIDES = {overrides(files['recipe.yaml']) if 'recipe.yaml' in files else []!r}\n"
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
assert [(r.name, r.kwargs) for r in cfg.reward.rewards] == [("redness", {{"channel": 0}})], cfg.reward.rewards
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

"""docs/agentic.md's "writing a tool / an environment" followed as written: its files added to a
copy of `agent_tools/`, its recipe loaded, the tool called through the runner and the environment
stepped, in a fresh Python (the registries of this session are left alone)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GUIDE_FILE = re.compile(r"^<!--\s*guide-file:\s*(?P<path>\S+)\s*-->\n```\w*\n(?P<code>.*?)^```", re.M | re.S)

SCRIPT = """
from omni_rl.compose import load_config
from omni_rl.agent import ENVIRONMENTS, TOOLS, Turn
from omni_rl.agent.components import ToolCall
from omni_rl.agent.runner import ToolRunner

cfg = load_config(["recipe=" + RECIPE])
agent = cfg.algo.family_options.agent_options
item = agent.tools[0]
tool = TOOLS.get(item["name"])(item["tool_options"])
runner = ToolRunner({item["name"]: tool}, timeout_s=5, max_output_chars=100)
print(runner.run(ToolCall("word_count", {"text": "one two three"})).observation)
print(runner.run(ToolCall("word_count", {"text": "w " * 200})).observation)
env = ENVIRONMENTS.get(agent.environment)(agent.environment_options, "p", {"start": 2})
print([(s.observation, s.reward, s.done) for s in (env.step(Turn(0, "5")), env.step(Turn(1, "2")), env.step(Turn(2, "1")))])
print(agent.turn_reward, agent.discount, cfg.reward.rewards[0].name)
"""


def test_the_agentic_guide_runs_as_written(tmp_path):
    files = {m["path"]: m["code"] for m in GUIDE_FILE.finditer((ROOT / "docs" / "agentic.md").read_text())}
    assert set(files) == {"agent_tools/word_count.py", "agent_tools/countdown.py", "recipe.yaml"}
    shutil.copytree(ROOT / "agent_tools", tmp_path / "agent_tools", ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in files.items():
        (tmp_path / path).write_text(text)
    recipe = yaml.safe_load(files["recipe.yaml"])
    assert recipe["algo"]["family_options"]["agent_options"]["environment"] == "countdown"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    script = f"RECIPE = {str(tmp_path / 'recipe.yaml')!r}\n" + SCRIPT
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()[-4:]
    assert lines[0] == "3"
    assert lines[1] == "error: word_count failed: ValueError: 200 words, over 100"
    assert lines[2] == "[('Say 2.', -1.0, False), ('Next.', 1.0, False), ('Done.', 1.0, True)]"
    assert lines[3] == "discounted 0.9 trajectory_return"

"""Every command the README and docs/ show is checked, or marked as needing what CI lacks.

Each fenced shell block and each inline `python ...` / `pip install ...` span of README.md and
docs/**/*.md is one case (`tests/docs/doc_commands.py` says what is checked for each kind of
command). A block marked `planned` uses the config layout of issue 24 that is still being built:
its check is expected to fail until that layout lands, and the case fails as soon as it passes,
so the marker is removed then and the command is checked like any other.

The checker itself is tested on made-up pages: a doc that names a recipe, key, file, module or
flag that does not exist must fail; so must a page that names a file of the repository that
does not exist.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.doc_commands import ROOT, DocCommand, check, doc_files, extract, missing_paths

README_MAX_LINES = 200


def _cases():
    cases = []
    for path in doc_files():
        commands, _ = extract(path)
        for command in commands:
            marks = []
            if "planned" in command.marks:
                marks.append(pytest.mark.xfail(
                    strict=True,
                    reason="uses issue 24's planned config layout; when this passes, drop `planned` from its marker",
                ))
            cases.append(pytest.param(command, id=f"{command.where} {command.text.splitlines()[0][:60]}", marks=marks))
    return cases


@pytest.mark.parametrize("command", _cases())
def test_doc_command(command: DocCommand):
    problems = check(command)
    assert not problems, f"{command.where}: {command.text}\n  " + "\n  ".join(problems)


def test_doc_markup_is_well_formed():
    problems = [p for path in doc_files() for p in extract(path)[1]]
    assert not problems, "\n".join(problems)


def test_files_the_docs_name_exist():
    problems = [p for path in doc_files() for p in missing_paths(path)]
    assert not problems, "\n".join(problems)


def test_the_docs_show_commands():
    # Guards the extractor: the README's two set-up commands and the docs' commands are found.
    readme, _ = extract(ROOT / "README.md")
    assert any("python main_omni.py" in c.text for c in readme)
    assert sum(len(extract(p)[0]) for p in doc_files()) >= 30


def test_readme_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    readme, _ = extract(ROOT / "README.md")
    test_commands = [line for c in readme if not c.inline for line in c.text.splitlines() if "python -m pytest" in line]
    assert test_commands, "the README shows no test command"
    assert test_commands[0] in ci, f"README's test command {test_commands[0]!r} is not a line of .ci/run"


def test_readme_is_a_landing_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_mkdocs_nav_names_every_page():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    named = set(re.findall(r":\s*([\w/-]+\.md)\s*$", nav, flags=re.M))
    assert pages == named, f"in docs/ but not in the nav: {sorted(pages - named)}; in the nav only: {sorted(named - pages)}"


# ------------------------------------------------------------------------------------------
# The checker, on made-up pages
# ------------------------------------------------------------------------------------------


def _page(tmp_path: Path, text: str) -> list[DocCommand]:
    page = tmp_path / "page.md"
    page.write_text(text)
    commands, problems = extract(page)
    assert not problems, problems
    return commands


def _problems(tmp_path: Path, text: str) -> list[str]:
    return [p for c in _page(tmp_path, text) for p in check(c)]


@pytest.mark.parametrize("text, expected", [
    ("```bash\npython main_omni.py recipe=tiny_sd3_flowgrpo_nope\n```\n", "tiny_sd3_flowgrpo_nope"),
    ("```bash\npython main_omni.py recipe=tiny_qwen3_grpo trainer.total_stepz=3\n```\n", "total_stepz"),
    ("```bash\npython main_omni.py algo.policy_loss=no_such_loss\n```\n", "no_such_loss"),
    ("```bash\npython -m pytest tests/omni_rl/test_no_such_file.py\n```\n", "test_no_such_file.py"),
    ("```bash\npython benchmarks/no_such_benchmark.py\n```\n", "no_such_benchmark.py"),
    ("```bash\npython benchmarks/scaling.py --no-such-flag 3\n```\n", "--no-such-flag"),
    ("```bash\npython -m omni_rl.no_such_module --out x\n```\n", "omni_rl.no_such_module"),
    ("```bash\npython -c \"from omni_rl.logging import no_such_function\"\n```\n", "no_such_function"),
    ("```bash\npip install -e \".[no_such_extra]\"\n```\n", "no_such_extra"),
    ("```bash\npython benchmarks/rollout_batching.py --out benchmarks/no_such_folder/x.json\n```\n", "no_such_folder"),
    ("```bash\nsome_tool --flag\n```\n", "some_tool"),
    ("Run `python main_omni.py recipe=no_such_inline_recipe` to see it.\n", "no_such_inline_recipe"),
    ("Run `python -m pytest\ntests/no_such_dir` to see it.\n", "no_such_dir"),
    # A marked block is checked statically: the recipe and the keys still must exist.
    ("<!-- doc-command: needs-gpu -->\n```bash\npython main_omni.py recipe=no_such_gpu_recipe\n```\n", "no_such_gpu_recipe"),
    ("<!-- doc-command: needs-gpu -->\n```bash\npython main_omni.py recipe=sd35_medium_flowgrpo_lora rollout.no_such_key=1\n```\n",
     "no_such_key"),
    ("<!-- doc-command: needs-docker -->\n```bash\ndocker build -f docker/Dockerfile.nope .\n```\n", "Dockerfile.nope"),
])
def test_checker_reports_what_does_not_exist(tmp_path, text, expected):
    problems = _problems(tmp_path, text)
    assert problems and any(expected in p for p in problems), problems


def test_checker_passes_what_exists(tmp_path):
    text = """
```bash
python main_omni.py recipe=tiny_qwen3_grpo trainer.total_steps=3 --cfg
python -m pytest tests/test_import_graph.py -k circle -m 'not slow'
python benchmarks/scaling.py --steps 2 --out benchmarks/results/scaling.json  # a comment
OMNI_RL_CACHE=/tmp/x python -c "from omni_rl.logging import rise_report"
pip install torch==2.14.1 && pip install -e ".[test]"
```

<!-- doc-command: needs-gpu (a comment) -->
```bash
python main_omni.py recipe=sd35_medium_flowgrpo_lora rollout.backend=vllm_omni \\
  trainer.total_steps=2
```
"""
    commands = _page(tmp_path, text)
    assert len(commands) == 2 and len(commands[0].text.splitlines()) == 5
    assert commands[1].marks == {"needs-gpu"} and "trainer.total_steps=2" in commands[1].text
    assert [p for c in commands for p in check(c)] == []


@pytest.mark.parametrize("text, expected", [
    ("<!-- doc-command: needs-coffee -->\n```bash\nls\n```\n", "needs-coffee"),
    ("<!-- doc-command: needs-gpu -->\n\nSome prose.\n", "must stand on the line before"),
    ("```\npython main_omni.py\n```\n", "fence it as ```bash"),
])
def test_markup_problems_are_reported(tmp_path, text, expected):
    page = tmp_path / "page.md"
    page.write_text(text)
    _, problems = extract(page)
    assert any(expected in p for p in problems), problems


def test_a_missing_file_named_in_prose_is_reported(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("The engine is `omni_rl/rollout/base.py`; the old one was\n`omni_rl/rollout/no_such_engine.py`; "
                    "checkpoints go to `docs/step_NNNNNN/`.\n")
    problems = missing_paths(page)
    assert len(problems) == 1 and "no_such_engine.py" in problems[0] and ":2:" in problems[0], problems

"""Docstrings stay short: their share of all lines of omni_rl/ and rewards/, counted with `ast`.

A docstring's lines are those of its string expression (module, class and function
docstrings alike). Tables, rationale and history belong in docs/, which the share keeps them
moving to; the helper is checked on a hand-made file so a green run means the count works.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_SHARE = 0.15


def docstring_lines(source: str) -> int:
    """Lines taken by the module, class and function docstrings of one file."""
    total = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                total += first.end_lineno - first.lineno + 1
    return total


def share(package: Path) -> tuple[int, int]:
    """(docstring lines, all lines) over every `.py` file under `package`."""
    doc = lines = 0
    for path in sorted(package.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        doc += docstring_lines(source)
        lines += len(source.splitlines())
    return doc, lines


def test_counter_counts_every_kind_of_docstring():
    source = '"""Module,\non two lines."""\n\nclass A:\n    """One."""\n\n    def f(self):\n' \
             '        """Three\n\n        lines."""\n        x = "not a docstring"\n\n\nasync def g():\n' \
             '    """One."""\n'
    assert docstring_lines(source) == 2 + 1 + 3 + 1


@pytest.mark.parametrize("package", ["omni_rl", "rewards"])
def test_docstrings_are_at_most_their_share(package):
    doc, lines = share(ROOT / package)
    assert lines > 2_000, f"read only {lines} lines under {ROOT / package}: wrong folder?"
    assert doc / lines <= MAX_SHARE, (
        f"docstrings are {doc} of {lines} lines of {package}/ ({doc / lines:.1%}), over {MAX_SHARE:.0%}: "
        "keep module docstrings to what the module does, what it leaves out and one example; "
        "move tables and rationale to docs/")

"""Options are bound once: only the composition root (`omni_rl/compose.py`) turns a recipe's
options block into its component's options instance (`omni_rl.config.options.bind_options`),
stores it in the config in the block's place, and every component reads that instance.

Read from the source with `ast`, like tests/test_import_graph.py: every `.py` file under
omni_rl/, adapters/, rewards/ and demos/ is parsed, and each call of `bind_options` (by its name,
as an attribute `x.bind_options(...)`, or under another name it was imported as) and each import
of it outside `BINDS` is reported with its file and line. The last tests check the checker on
hand-written source, so a green run means "bound nowhere else", not "saw nothing".
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("omni_rl", "adapters", "rewards", "demos")
BINDER = "bind_options"
# The modules that may bind a block: the composition root, and the module that defines the binder.
BINDS = ("omni_rl/compose.py", "omni_rl/config/options.py")


def binds_in(source: str, where: str) -> list[str]:
    """"where:line what" for each import or call of the binder in `source`."""
    tree = ast.parse(source)
    names = {BINDER}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == BINDER:
                    names.add(alias.asname or alias.name)
                    found.append(f"{where}:{node.lineno} imports {BINDER}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if called in names:
                found.append(f"{where}:{node.lineno} calls {called}")
    return sorted(found)


def binds_outside_the_root(root: Path = ROOT) -> list[str]:
    found = []
    for package in PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            where = file.relative_to(root).as_posix()
            if where not in BINDS:
                found += binds_in(file.read_text(encoding="utf-8"), where)
    return found


def test_no_block_is_bound_below_the_composition_root():
    bad = binds_outside_the_root()
    assert not bad, (
        "an options block is bound outside the composition root; read the bound instance the config holds "
        "(`cfg.model.adapter_options`, `cfg.algo.family_options`, ...) instead:\n  " + "\n  ".join(bad)
    )


def test_the_root_is_where_blocks_are_bound():
    # Guards the check above against passing vacuously (a wrong root, a renamed binder).
    assert binds_in((ROOT / "omni_rl/compose.py").read_text(encoding="utf-8"), "compose")


def test_the_checker_sees_calls_attributes_and_aliases():
    source = (
        "from omni_rl.config.options import bind_options as bind\n"
        "import omni_rl.config.options as o\n"
        "x = bind(A, {}, 'k', 'o')\n"
        "y = o.bind_options(A, {}, 'k', 'o')\n"
        "z = Adapter.bind_options(cfg)\n"
        "w = bound_options(cfg)\n"          # another name: not the binder
    )
    assert binds_in(source, "f.py") == ["f.py:1 imports bind_options", "f.py:3 calls bind", "f.py:4 calls bind_options",
                                        "f.py:5 calls bind_options"]

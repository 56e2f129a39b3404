"""Imports run one way: the project's import graph, read from the source with `ast`.

Every `.py` file under omni_rl/, adapters/, rewards/ and demos/ is parsed and every import statement in
it counts, wherever it stands (module level, inside a function, under `if TYPE_CHECKING:`): an
import inside a function is a deferred circle, not the absence of one. Each import is resolved
to a project module:

- `import a.b.c` is an edge to the longest prefix of `a.b.c` that is a project module;
- `from a.b import name` is an edge to the module `a.b.name` when that is one (a submodule
  imported by name), else to `a.b`; relative imports are resolved against the importing file.

The implicit import of parent packages (`import a.b.c` also runs `a/__init__.py`) is not an
edge: counting it would make every package that imports its own submodules a circle. Imports
named by a string at run time (`importlib.import_module`, entry points) are not seen; that is
how the core finds plugins without importing them.

Checked: (a) no cycle among the modules; (b) nothing under omni_rl/ imports adapters/,
rewards/ or demos/ (plugins point at the core, never back), and nothing outside demos/ imports
it (a demo sits on top of the core and the project's plugins); (c) omni_rl/algos imports nothing from the
core but itself and the modules that import nothing of the project (`ALGOS_MAY_IMPORT`: the
registry, the errors, `option()`) (pure tensor maths); (d) the core's packages import only
their own layer or the layers below (`LAYERS`: the composition root and the CLI on top, then
the trainer loop, the Ray workers, the model families, the services they use, the model
contracts, and at the bottom the maths, the config and the registry). The last tests check the checker on
hand-made graphs and a planted package, so a green run means "no cycle", not "saw nothing".
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("omni_rl", "adapters", "rewards", "demos", "agent_tools")
PLUGINS = ("adapters", "rewards", "demos", "agent_tools")  # top-level packages found through the `omni_rl.plugins` entry points

Graph = dict[str, dict[str, str]]  # module -> {imported module: "file:line" of its first import}


def project_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the given top-level packages."""
    modules = {}
    for package in packages:
        for file in sorted((root / package).rglob("*.py")):
            parts = list(file.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = file
    return modules


def _longest_module_prefix(name: str, modules: dict[str, Path]) -> str | None:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _from_base(node: ast.ImportFrom, module: str, file: Path) -> str:
    """The absolute module named by `from X import ...` (resolving a relative X)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if file.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(module: str, file: Path, modules: dict[str, Path], root: Path) -> dict[str, str]:
    """The project modules `module` imports -> where (file:line, relative to root) it first imports each."""
    tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    out: dict[str, str] = {}
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in sorted(imports, key=lambda node: node.lineno):  # so each edge names its first line
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_longest_module_prefix(alias.name, modules) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module, file)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.append(submodule if submodule in modules else _longest_module_prefix(base, modules))
        for target in targets:
            if target is not None and target != module:
                out.setdefault(target, f"{file.relative_to(root).as_posix()}:{node.lineno}")
    return out


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> Graph:
    modules = project_modules(root, packages)
    return {name: imported_modules(name, file, modules, root) for name, file in modules.items()}


def strongly_connected_components(graph: dict[str, object]) -> list[list[str]]:
    """Tarjan's algorithm (iterative, so deep graphs do not hit the recursion limit): the
    components with more than one module, i.e. the import cycles, each sorted, in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(components)


def one_cycle(graph: Graph, component: list[str]) -> list[str]:
    """A shortest import path from the component's first module back to itself (breadth first,
    inside the component): the concrete circle to show in a failure message."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child in members and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{component} is not a cycle")  # Tarjan only returns cycles


def describe_cycles(graph: Graph, components: list[list[str]]) -> str:
    lines = []
    for component in components:
        path = one_cycle(graph, component)
        lines.append(f"cycle among {component}:")
        lines += [f"    {a} -> {b}  ({graph[a][b]})" for a, b in zip(path, path[1:])]
    return "\n".join(lines)


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def core_imports_of_plugins(graph: Graph) -> list[str]:
    """Each import of a plugin package (`PLUGINS`) by a module of omni_rl/, as "a imports b (file:line)"."""
    return [
        f"{module} imports {target} ({where})"
        for module, targets in sorted(graph.items()) if _in(module, "omni_rl")
        for target, where in sorted(targets.items()) if any(_in(target, plugin) for plugin in PLUGINS)
    ]


def imports_of_demos(graph: Graph) -> list[str]:
    """Each import of demos/ by a module outside it (the core or another plugin)."""
    return [
        f"{module} imports {target} ({where})"
        for module, targets in sorted(graph.items()) if not _in(module, "demos")
        for target, where in sorted(targets.items()) if _in(target, "demos")
    ]


# The core's layers, top first; a package may import its own layer and those below it.
LAYERS = (
    # The evaluation job sits with the command line (it builds models and reads checkpoints); the
    # benchmarks, rules, figures and the held-out alarm beside the families, where the trainer reads them.
    ("omni_rl.compose", "omni_rl.cli", "omni_rl.eval.job", "omni_rl.eval.compare", "omni_rl.eval.cli_args",
     "omni_rl.eval.model_source", "omni_rl.eval.ray_shards",
     # Processes that start from a run's written config bind its options here: the rollout server
     # (`python -m omni_rl.rollout.server`) and the offline export of a sharded checkpoint.
     "omni_rl.rollout.server.serve", "omni_rl.rollout.server.__main__", "omni_rl.trainer.sharded_export"),
    ("omni_rl.trainer", "omni_rl.plan"),
    ("omni_rl.workers",),
    ("omni_rl.families", "omni_rl.eval"),
    ("omni_rl.data", "omni_rl.rollout", "omni_rl.engine", "omni_rl.reward", "omni_rl.logging", "omni_rl.agent"),
    ("omni_rl.models",),
    ("omni_rl.algos", "omni_rl.device", "omni_rl.plugins"),
    ("omni_rl.config", "omni_rl.registry", "omni_rl.utils", "omni_rl.errors", "omni_rl.option", "omni_rl"),
)


def layer_of(module: str) -> int | None:
    """Depth of the longest `LAYERS` entry that `module` is or lies in (0 = top); None outside."""
    best = None
    for depth, names in enumerate(LAYERS):
        for name in names:
            if _in(module, name) and (best is None or len(name) > len(best[1])):
                best = (depth, name)
    return None if best is None else best[0]


def imports_against_the_layers(graph: Graph) -> list[str]:
    """Each import by a core module of a module in a layer above its own."""
    return [
        f"{module} imports {target} ({where})"
        for module, targets in sorted(graph.items()) if layer_of(module) is not None
        for target, where in sorted(targets.items())
        if layer_of(target) is not None and layer_of(target) < layer_of(module)
    ]


# The modules of the core that import nothing of the project, which the maths may use: the
# registry, the error bases (`ConfigError`) and `option()`, the one way an option is declared.
ALGOS_MAY_IMPORT = ("omni_rl.registry", "omni_rl.errors", "omni_rl.option")


def algos_imports_outside_registry(graph: Graph) -> list[str]:
    """Each import by omni_rl/algos of a project module other than `ALGOS_MAY_IMPORT` and algos itself."""
    def allowed(target: str) -> bool:
        return target in ALGOS_MAY_IMPORT or _in(target, "omni_rl.algos")

    return [
        f"{module} imports {target} ({where})"
        for module, targets in sorted(graph.items()) if _in(module, "omni_rl.algos")
        for target, where in sorted(targets.items()) if not allowed(target)
    ]


# ------------------------------------------------------------------------------------------
# The project
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph()


def test_the_graph_sees_the_project(graph):
    # Guards the checks below against passing vacuously (a wrong root finds no files).
    assert {"omni_rl.trainer.ppo_trainer", "rewards.math_answer", "adapters.sd3"} <= set(graph)
    assert "omni_rl.registry" in graph["omni_rl.algos.flow_sde"]
    assert "omni_rl.data.chat_prompts" in graph["omni_rl.data.prompts"]  # a `from` import of names


def test_no_import_cycles(graph):
    components = strongly_connected_components(graph)
    assert not components, (
        "import cycles (break each by moving the shared names into a module both import, or by "
        "making the dependency one-way):\n" + describe_cycles(graph, components)
    )


def test_core_never_imports_plugins(graph):
    bad = core_imports_of_plugins(graph)
    assert not bad, (
        "the core finds adapters and rewards through the registries, never by module path:\n  " + "\n  ".join(bad)
    )


def test_the_demos_are_plugins_on_top(graph):
    assert {"demos.shapes.reward", "demos.shapes.model"} <= set(graph)  # seen, so the check below is not vacuous
    bad = imports_of_demos(graph)
    assert not bad, "nothing outside demos/ imports a demo (it registers through its entry point):\n  " + "\n  ".join(bad)


def test_every_core_module_has_a_layer(graph):
    named = [name for names in LAYERS for name in names if name != "omni_rl"]
    unplaced = sorted(m for m in graph if _in(m, "omni_rl") and m != "omni_rl" and not any(_in(m, n) for n in named))
    assert not unplaced, f"core modules in no layer of LAYERS (add their package to a layer): {unplaced}"


def test_imports_run_down_the_layers(graph):
    bad = imports_against_the_layers(graph)
    assert not bad, "a core package imports a layer above its own:\n  " + "\n  ".join(bad)


def test_layer_check_on_a_hand_made_graph():
    graph = {
        "omni_rl.config.schema": {"omni_rl.trainer.loop": "x:1"},   # bottom imports top: reported
        "omni_rl.trainer.loop": {"omni_rl.config.schema": "x:2", "omni_rl.compose": "x:3"},
        "omni_rl.families.base": {"omni_rl.rollout.base": "x:4"},   # down: fine
    }
    assert imports_against_the_layers(graph) == [
        "omni_rl.config.schema imports omni_rl.trainer.loop (x:1)",
        "omni_rl.trainer.loop imports omni_rl.compose (x:3)",
    ]


def test_algos_import_only_the_registry(graph):
    bad = algos_imports_outside_registry(graph)
    assert not bad, (
        f"omni_rl/algos is pure tensor maths; from the project it may import {', '.join(ALGOS_MAY_IMPORT)} only:\n  "
        + "\n  ".join(bad)
    )


# ------------------------------------------------------------------------------------------
# The checker itself
# ------------------------------------------------------------------------------------------


def test_cycle_finder_on_hand_made_graphs():
    acyclic = {"a": {"b": ""}, "b": {"c": ""}, "c": {}, "d": {"a": "", "c": ""}}
    assert strongly_connected_components(acyclic) == []
    graph = {
        "a": {"b": "a.py:1"}, "b": {"c": "b.py:2"}, "c": {"a": "c.py:3", "d": "c.py:4"},  # a -> b -> c -> a
        "d": {}, "e": {"f": "e.py:5"}, "f": {"e": "f.py:6"},                                   # e <-> f
        "g": {"a": "g.py:7"},                                                 # reaches a cycle, is in none
    }
    assert strongly_connected_components(graph) == [["a", "b", "c"], ["e", "f"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    message = describe_cycles(graph, [["e", "f"]])
    assert "e -> f  (e.py:5)" in message and "f -> e  (f.py:6)" in message


def test_cycle_finder_reports_the_shortest_circle():
    graph = {"a": {"b": "", "c": ""}, "b": {"c": ""}, "c": {"a": ""}}
    assert strongly_connected_components(graph) == [["a", "b", "c"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a", "c", "a"]


def test_a_planted_cycle_is_found(tmp_path):
    # pkg.x imports pkg.y inside a function, pkg.y names pkg.x with `from pkg import x`
    # (a submodule by name), pkg.z uses a relative import of a name, not a module: pkg.x.
    # pkg/__init__.py imports its submodules, which is not a cycle with them.
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg import x, y, z\n")
    (package / "x.py").write_text("def f():\n    import pkg.y\n    return pkg.y\n")
    (package / "y.py").write_text("from pkg import x\n")
    (package / "z.py").write_text("from .x import f\nimport os\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert {module: set(targets) for module, targets in graph.items()} == {
        "pkg": {"pkg.x", "pkg.y", "pkg.z"},
        "pkg.x": {"pkg.y"},
        "pkg.y": {"pkg.x"},
        "pkg.z": {"pkg.x"},
    }
    assert graph["pkg.x"]["pkg.y"] == "pkg/x.py:2"
    assert strongly_connected_components(graph) == [["pkg.x", "pkg.y"]]
    assert "pkg.x -> pkg.y  (pkg/x.py:2)" in describe_cycles(graph, [["pkg.x", "pkg.y"]])


def test_layer_rules_on_a_hand_made_graph():
    graph = {
        "omni_rl.trainer.loop": {"rewards.math_answer": "omni_rl/trainer/loop.py:3", "omni_rl.registry": "x:1"},
        "omni_rl.algos.loss": {"omni_rl.algos.kernels": "x:2", "omni_rl.registry": "x:3", "omni_rl.config": "x:4"},
        "omni_rl.algos_extra": {"adapters": "x:5"},  # a sibling named like algos is not algos
        "rewards.math_answer": {"omni_rl.reward": "x:6"},
        "adapters.sd3": {"omni_rl.models": "x:7", "adapters.qwen3": "x:8"},
    }
    assert core_imports_of_plugins(graph) == [
        "omni_rl.algos_extra imports adapters (x:5)",
        "omni_rl.trainer.loop imports rewards.math_answer (omni_rl/trainer/loop.py:3)",
    ]
    assert algos_imports_outside_registry(graph) == ["omni_rl.algos.loss imports omni_rl.config (x:4)"]


def test_demo_rules_on_a_hand_made_graph():
    graph = {
        "omni_rl.trainer.loop": {"demos.shapes": "omni_rl/trainer/loop.py:4"},   # the core imports a demo
        "adapters.sd3": {"demos.shapes.model": "adapters/sd3.py:9"},            # so does another plugin
        "demos.shapes.pretrain": {"adapters.sd3": "x:1", "demos.shapes.model": "x:2", "omni_rl.models": "x:3"},
    }
    assert core_imports_of_plugins(graph) == ["omni_rl.trainer.loop imports demos.shapes (omni_rl/trainer/loop.py:4)"]
    assert imports_of_demos(graph) == [
        "adapters.sd3 imports demos.shapes.model (adapters/sd3.py:9)",
        "omni_rl.trainer.loop imports demos.shapes (omni_rl/trainer/loop.py:4)",
    ]

"""Finding extensions by module name (omni_rl/plugins.py).

The plugin modules are written to tmp_path under unique names, so they never clash with another
test's module or registry entry; the fixture removes them from `sys.modules` afterwards.
"""
import sys
import uuid

import pytest

from omni_rl import plugins
from omni_rl.compose import load_config
from omni_rl.plugins import PluginError, load_plugins
from omni_rl.registry import RegistryError
from omni_rl.reward import REWARDS, build_reward

PLUGIN_SOURCE = '''
from omni_rl.reward import register_reward


@register_reward("{reward}")
def constant(*, value: float = 0.25):
    return lambda images, prompts, metadata: [value] * len(prompts)
'''


@pytest.fixture
def make_plugin(tmp_path, monkeypatch):
    """Write a module to tmp_path, put it on sys.path, and return its (unique) name."""
    load_plugins()  # the project's own plugins first, so the snapshots below hold them
    monkeypatch.setattr(plugins, "_loaded", set(plugins._loaded))
    monkeypatch.setattr(REWARDS, "_entries", dict(REWARDS._entries))
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []

    def make(source: str) -> str:
        name = f"omni_rl_test_plugin_{uuid.uuid4().hex[:12]}"
        (tmp_path / f"{name}.py").write_text(source)
        written.append(name)
        return name

    yield make
    for name in written:
        sys.modules.pop(name, None)


def test_missing_module_raises_naming_it():
    with pytest.raises(PluginError, match="'nonexistent_module_xyz'") as info:
        load_plugins(["nonexistent_module_xyz"])
    assert isinstance(info.value, ImportError)
    assert "\n" not in str(info.value)


def test_module_with_a_missing_dependency_names_the_plugin(make_plugin):
    name = make_plugin("import nonexistent_dependency_xyz\n")
    with pytest.raises(PluginError) as info:
        load_plugins([name])
    assert repr(name) in str(info.value) and "nonexistent_dependency_xyz" in str(info.value)
    assert name not in plugins._loaded  # a failed import is retried next time, not remembered


def test_plugin_reward_becomes_buildable(make_plugin):
    reward = f"tests.plugins.{uuid.uuid4().hex[:12]}"
    name = make_plugin(PLUGIN_SOURCE.format(reward=reward))
    with pytest.raises(RegistryError, match=f"unknown reward '{reward}'"):
        build_reward(reward)
    assert name in load_plugins([name])
    scorer = build_reward(reward, value=0.5)
    assert scorer(None, ["a", "b"], [{}, {}]) == [0.5, 0.5]


def test_reward_from_a_config_named_plugin_passes_load(make_plugin):
    # Whatever checks reward names at load time must load `cfg.plugins` first.
    reward = f"tests.plugins.{uuid.uuid4().hex[:12]}"
    name = make_plugin(PLUGIN_SOURCE.format(reward=reward))
    cfg = load_config([f"plugins=[{name}]", f"reward.rewards=[{{name: '{reward}'}}]"])
    assert cfg.plugins == [name] and cfg.reward.rewards[0].name == reward


def test_a_package_imports_every_module_but_its_helpers(tmp_path, monkeypatch):
    """`import_package_modules`, as a plugin package's `__init__` calls it: a new file in the
    package (or a subpackage) is imported with no edit; a declared helper is not."""
    name = f"omni_rl_test_package_{uuid.uuid4().hex[:12]}"
    package = tmp_path / name
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from omni_rl.plugins import import_package_modules\n"
        "IMPORTED = import_package_modules(__name__, __path__, ('helper', 'sub.quiet'))\n"
    )
    for file in ("b.py", "a.py", "helper.py", "sub/__init__.py", "sub/c.py", "sub/quiet.py"):
        (package / file).write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = __import__(name)
        assert module.IMPORTED == [f"{name}.a", f"{name}.b", f"{name}.sub", f"{name}.sub.c"]
        assert f"{name}.helper" not in sys.modules and f"{name}.sub.quiet" not in sys.modules
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(f"{name}.")]:
            del sys.modules[key]

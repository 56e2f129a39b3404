"""Demos built on omni-rl. Each is a plugin package: it imports `omni_rl` (and may use the
project's adapters), and nothing in `omni_rl/`, `adapters/` or `rewards/` imports it; the core
finds it through the `omni_rl.plugins` entry point that names it (pyproject.toml).

- `shapes`: the GenEval-style shape demo (the default recipe, `tiny_sd3_shapes_counting`).
"""

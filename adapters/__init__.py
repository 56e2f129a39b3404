"""Model adapters. `import adapters` imports every module of this package and of its
subpackages, so a new file registers itself with no second edit.

One layout for every model: `adapters/<model>.py` the adapter (a package `adapters/<model>/`
when it has several files: BAGEL), `adapters/tiny/<model>.py` its tiny random-weight models
(`tiny:NAME`), `adapters/plan/<model>.py` its view for the planner (`--plan`).
"""
from omni_rl.plugins import import_package_modules

# Modules that register nothing: imported by the modules that use them.
# tests/adapters/test_registration.py checks that every other module registers something.
HELPERS = ("bagel.checkpoint", "bagel.layout", "bagel.network", "bagel.vision", "tiny.decoders")

import_package_modules(__name__, __path__, HELPERS)

"""Which modules of a plugin package register something: shared by the registration tests of
`adapters/` and `rewards/`.

`registrations(package)` imports the package in a fresh Python (so every registration happens
there, not earlier in the test session) with `Registry._add` recording, for every entry of every
registry, the package module whose code registered it: the innermost frame of the package on
the stack, and the frames of the package that called it directly (a helper's function that
registers on its caller's behalf counts for both); an import is a boundary, so a module is not
credited with what the modules it imports register.
"""
from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RECORD = """
import json, sys
from omni_rl.registry import Registry

PACKAGE = sys.argv[1]
counts = {}
add = Registry._add

def in_package(frame):
    name = frame.f_globals.get("__name__", "")
    return name == PACKAGE or name.startswith(PACKAGE + ".")

def recording(self, name, obj, spec=None):
    frame = sys._getframe(1)
    while frame is not None and not in_package(frame):
        frame = frame.f_back
    while frame is not None and in_package(frame):
        module = frame.f_globals["__name__"]
        counts[module] = counts.get(module, 0) + 1
        frame = frame.f_back
    return add(self, name, obj, spec)

Registry._add = recording
import importlib
package = importlib.import_module(PACKAGE)
for helper in package.HELPERS:
    importlib.import_module(PACKAGE + "." + helper)
print(json.dumps(counts))
"""


def registrations(package: str) -> dict[str, int]:
    """{module: entries it registered} for `package` imported in a fresh Python."""
    proc = subprocess.run([sys.executable, "-c", _RECORD, package], capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def modules(package: str) -> list[str]:
    """Every module (not package) under `package`'s folder, as dotted names."""
    found = []

    def walk(prefix: str, folder: Path) -> None:
        for info in pkgutil.iter_modules([str(folder)], prefix=f"{prefix}."):
            if info.ispkg:
                walk(info.name, folder / info.name.rsplit(".", 1)[1])
            else:
                found.append(info.name)

    walk(package, ROOT / package)
    return sorted(found)


def check_every_module_registers(package: str, helpers: tuple[str, ...]) -> None:
    """Every module of `package` registers something, except its declared helpers, which exist
    and register nothing."""
    counts = registrations(package)
    declared = {f"{package}.{h}" for h in helpers}
    every = modules(package)
    silent = [m for m in every if m not in declared and not counts.get(m)]
    assert not silent, (
        f"{silent} register nothing when `import {package}` imports them: register an entry there, "
        f"or list the module in {package}.HELPERS if it is a helper that other modules import"
    )
    missing = sorted(declared - set(every))
    assert not missing, f"{package}.HELPERS lists {missing}, which are not modules of the package"
    registering = sorted(m for m in declared if counts.get(m))
    assert not registering, f"{package}.HELPERS lists {registering}, which register entries: remove them from HELPERS"

"""An adapter module registers by being in `adapters/`: `import adapters` imports every module,
and every module that is not a declared helper registers something (an adapter, a tiny model,
a planner's view)."""
import adapters
from tests.registration import check_every_module_registers, registrations


def test_every_adapter_module_registers_something():
    check_every_module_registers("adapters", adapters.HELPERS)


def test_tiny_models_and_plans_register_from_their_own_folders():
    counts = registrations("adapters")
    for model in ("sd3", "ltx2", "bagel"):
        assert counts.get(f"adapters.tiny.{model}") and counts.get(f"adapters.plan.{model}"), counts

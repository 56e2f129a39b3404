"""Training engines behind one interface: `local` (one process); `fsdp2` with the Ray workers."""
from omni_rl.engine.base import TrainingEngine
from omni_rl.engine.local import LocalEngine, NonFiniteLossError

__all__ = ["LocalEngine", "NonFiniteLossError", "TrainingEngine"]

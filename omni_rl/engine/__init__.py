"""Training engines behind one interface: `local` (one process) and `fsdp2` (sharded, built by
the Ray workers; import `omni_rl.engine.fsdp2` for it, which needs torch.distributed)."""
from omni_rl.engine.base import TrainingEngine
from omni_rl.engine.local import LocalEngine, NonFiniteLossError

ENGINES = ("local", "fsdp2")

__all__ = ["ENGINES", "LocalEngine", "NonFiniteLossError", "TrainingEngine"]

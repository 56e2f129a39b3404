"""Training engines behind one interface (`base.TrainingEngine`), built by `trainer.engine`:
`local` (one process) and `fsdp2` (sharded; `omni_rl.engine.fsdp2` needs torch.distributed and
is imported only where it is built). `registry.TRAINING_ENGINES` holds their specs (builder, options)."""
from omni_rl.engine.base import NonFiniteLossError, TrainingEngine
from omni_rl.engine.local import LocalEngine
from omni_rl.engine.registry import TRAINING_ENGINES, build_engine, register_engine

__all__ = ["LocalEngine", "NonFiniteLossError", "TRAINING_ENGINES", "TrainingEngine", "build_engine", "register_engine"]

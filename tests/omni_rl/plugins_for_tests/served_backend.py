"""A plugin's rollout backend that runs behind the rollout server when `python` is set, as `vllm`
does: loaded with `plugins=[served_backend]` and this folder on PYTHONPATH, in the trainer's process
and in the server's. Its engine is the native text engine, marked in its counters
(`plugin_engine`), so a test sees whose engine the server built."""
from dataclasses import dataclass

from omni_rl.rollout.backends import ServerProcessOptions, register_rollout_backend
from omni_rl.rollout.server.client import start_server_engine
from omni_rl.rollout.text_native import NativeTextEngine


@dataclass
class ServedOptions(ServerProcessOptions):
    """Only where it runs (`python`) and the server's deadlines."""


class ServedEngine(NativeTextEngine):
    def __init__(self, model):
        super().__init__(model, max_num_seqs=8)
        self.stats["plugin_engine"] = 1


@register_rollout_backend("tests.served", ServedOptions, multi_turn=True, beside_trainer=lambda cfg: None)
def served(cfg, model):
    options = cfg.rollout.backend_options
    if options.python is not None:
        return start_server_engine(cfg, model, options, backend="tests.served")
    return ServedEngine(model)

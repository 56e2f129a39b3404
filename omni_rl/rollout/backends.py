"""`ROLLOUT_BACKENDS`: `rollout.backend` names a `RolloutBackend`, the spec that builds a rollout engine.

One signature, `spec.build(cfg, model) -> RolloutEngine`: `native`, `server`, `vllm_omni` and
`vllm` (imported in their builders only). Each spec declares its options class,
`loads_own_weights`, `shares_model`, `beside_trainer(cfg)`, the model base it `samples` and the
`packages` it needs, all checked before the model loads.

    register_rollout_backend("name", options_class=MyOptions)   # in a plugin module
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from omni_rl.option import ComponentOptions, option
from omni_rl.config.schema import OmniConfig
from omni_rl.models.loading import resolve_model_path
from omni_rl.models.autoregressive import AutoregressiveModelBase
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.registry import Registry
from omni_rl.rollout.base import RolloutEngine, weight_kind
from omni_rl.rollout.diffusion_sampling import TRAJECTORY_DEVICES
from omni_rl.rollout.native import DRIVERS, NativeDiffusionEngine
from omni_rl.rollout.server.client import start_server_engine
from omni_rl.rollout.text_native import NativeTextEngine
from omni_rl.rollout.vllm_omni.availability import NEEDS

@dataclass
class NativeOptions(ComponentOptions):
    """The in-process engine's options (`rollout.backend_options`)."""

    max_wait_ms: float = option(5.0, "How long an idle diffusion engine waits for more requests before it starts a batch (request-level batching).")
    driver: str = option("auto", "Who iterates the diffusion engine: caller (the thread that waits for the rollout: a one-process run then has one computing thread), thread (a scheduler thread of the engine's own, for runs that overlap rollouts with updates on purpose) or auto (caller under trainer.pipeline=on_policy, else thread; a rollout server's engine uses its thread). See docs/rollout.md.")
    trajectory_device: str = option("device", "Where finished diffusion trajectories live: device (the rollout model's; no copy) or cpu (pinned host memory, non-blocking copies: for video, where a step's trajectories are gigabytes). Each moves once, when it finishes.")

    def check(self) -> None:
        if not self.max_wait_ms >= 0:
            raise ValueError(f"max_wait_ms={self.max_wait_ms!r}: expected >= 0")
        if self.driver not in ("auto", *DRIVERS):
            raise ValueError(f"driver={self.driver!r}: expected auto (caller on-policy, else thread), thread (a "
                             f"scheduler thread of the engine's own) or caller (the waiting thread iterates)")
        if self.trajectory_device not in TRAJECTORY_DEVICES:
            raise ValueError(f"trajectory_device={self.trajectory_device!r}: expected device (the rollout model's) or cpu "
                             f"(pinned host memory)")


@dataclass
class ServerProcessOptions(ComponentOptions):
    """A rollout engine in a process (and Python) of its own, behind the rollout server."""

    python: Optional[str] = option(None, "The interpreter that runs the rollout server (server: null = this one; vllm / vllm_omni: null runs the engine in this process, a Python named here, e.g. /opt/vllm-omni/bin/python, runs it behind the server).")
    server_timeout_s: float = option(60.0, "A server call (or, while sampling, its health check) that gets no answer within this long fails the step with an error naming the server; so does a server that exits.")
    server_startup_timeout_s: float = option(600.0, "How long the server may take to build its model and answer its first health check.")

    def check(self) -> None:
        if self.python is not None and self.python.strip() == "":
            raise ValueError(f"python={self.python!r}: expected a path to a Python interpreter, or null for this one")
        for name in ("server_timeout_s", "server_startup_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected > 0 seconds")


@dataclass
class ServerOptions(ServerProcessOptions, NativeOptions):
    """`server`: the native engine (and its options) in a process of its own."""

    def check(self) -> None:
        NativeOptions.check(self)
        ServerProcessOptions.check(self)


@dataclass
class VllmOptions(ServerProcessOptions):
    """`vllm` (text): vLLM's engine knobs, and the server process it may run behind."""

    gpu_memory_utilization: float = option(0.5, "Share of the GPU's memory vLLM may take for weights and its KV cache; leave room for the trainer when both share the GPU.")
    enforce_eager: bool = option(False, "No CUDA graphs / torch.compile: slower sampling, quicker start.")
    sleep_mode: bool = option(True, "Start with vLLM's sleep-mode allocator, so the engine's sleep() / wake() can free the GPU. Where the platform has none (a CPU) the engine starts without it and says so.")

    def check(self) -> None:
        ServerProcessOptions.check(self)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization!r}: expected a share of the GPU's "
                             f"memory in (0, 1], e.g. 0.5")


@dataclass
class VllmOmniOptions(VllmOptions, NativeOptions):
    """`vllm_omni` (diffusion): vLLM's knobs and its request batching's wait (`max_wait_ms`)."""

    def check(self) -> None:
        NativeOptions.check(self)
        VllmOptions.check(self)


@dataclass(frozen=True)
class RolloutBackend:
    """A registered rollout backend: how to build its engine and what it declares it can do."""

    build: Callable[[OmniConfig, Any], RolloutEngine]
    options_class: type = NativeOptions
    # Why it cannot sample while the trainer updates (None: it can); no function: it cannot.
    beside_trainer: Optional[Callable[[OmniConfig], Optional[str]]] = None
    shares_model: bool = False
    loads_own_weights: bool = False
    # Whether its text engine's log-probs under a top-p nucleus are the trainer's (of the whole
    # tempered distribution); False (vLLM's renormalise over the nucleus): the text family
    # refuses rollout.sampling_options.top_p < 1 at load.
    takes_top_p: bool = True
    # Whether its text results carry a MoE model's routed experts (`TextResult.routes`), which
    # algo.family_options.routing_replay=r3 replays; False: the text family refuses r3 at load.
    records_routes: bool = False
    # The backend's rules on the rest of the config (`ValueError` naming the key), run at load.
    check_config: Optional[Callable[[OmniConfig], None]] = None
    # The model base class its engine samples (None: any adapter).
    samples: Optional[type] = None
    # (module, pip name) pairs its engine imports: the Python it runs in must have them.
    packages: tuple[tuple[str, str], ...] = ()
    # Whether its text engine samples an agent's multi-turn trajectories (`generate_turns`: no
    # prefix encoded twice, the native engine's KV cache or vLLM's prefix cache); False: an
    # `agent:` run refuses it at load.
    multi_turn: bool = False


ROLLOUT_BACKENDS: Registry[RolloutBackend] = Registry("rollout backend")


def register_rollout_backend(name: str, options_class: type = NativeOptions, beside_trainer=None,
                             shares_model: bool = False, loads_own_weights: bool = False, check_config=None,
                             takes_top_p: bool = True, samples: Optional[type] = None,
                             packages: tuple[tuple[str, str], ...] = (), records_routes: bool = False,
                             multi_turn: bool = False):
    """Decorator: register `build(cfg, model) -> RolloutEngine` as backend `name` with its spec."""
    def decorator(build):
        ROLLOUT_BACKENDS.register(name, RolloutBackend(build, options_class, beside_trainer, shares_model,
                                                       loads_own_weights, takes_top_p, records_routes, check_config,
                                                       samples, packages, multi_turn))
        return build

    return decorator


def check_backend_fits(backend: str, adapter_class: type, adapter: str) -> None:
    """ValueError naming `rollout.backend` unless its engine samples models of `adapter_class`'s kind
    (`RolloutBackend.samples`), with the backends that do."""
    wanted = ROLLOUT_BACKENDS.get(backend).samples
    if wanted is None or issubclass(adapter_class, wanted):
        return
    fits = [n for n in ROLLOUT_BACKENDS.names()
            if ROLLOUT_BACKENDS.get(n).samples is None or issubclass(adapter_class, ROLLOUT_BACKENDS.get(n).samples)]
    raise ValueError(
        f"rollout.backend={backend!r} samples {wanted.family} models ({wanted.__name__}), and model.adapter={adapter!r} is a "
        f"{adapter_class.family} model ({adapter_class.__name__}); use one of the backends that sample it: {', '.join(fits)}"
    )


def build_rollout_engine(cfg: OmniConfig, model) -> RolloutEngine:
    return ROLLOUT_BACKENDS.get(cfg.rollout.backend).build(cfg, model)


def beside_trainer_problem(cfg: OmniConfig) -> Optional[str]:
    """Why `rollout.backend`'s engine cannot sample while the trainer updates; None if it can."""
    check = ROLLOUT_BACKENDS.get(cfg.rollout.backend).beside_trainer
    if check is None:
        return "its spec does not declare that it can sample while the trainer updates (beside_trainer)"
    return check(cfg)


def shares_model(cfg: OmniConfig) -> bool:
    """Whether `rollout.backend`'s engine samples with the very model object it is built on."""
    return ROLLOUT_BACKENDS.get(cfg.rollout.backend).shares_model


def _always(cfg: OmniConfig) -> Optional[str]:
    return None


def _own_process_only(cfg: OmniConfig) -> Optional[str]:
    if cfg.rollout.backend_options.python is not None:
        return None  # the engine runs behind the rollout server, in a process of its own
    return (f"in this process (rollout.backend_options.python=null) the {cfg.rollout.backend} engine shares the trainer's "
            f"accelerator and has not been run beside an update; set rollout.backend_options.python (e.g. "
            f"/opt/vllm-omni/bin/python) to run it in a process of its own")


def native_driver(cfg: OmniConfig, driver: str) -> str:
    """`auto` -> `caller` where the trainer waits for each rollout (`trainer.pipeline=on_policy`):
    an idle thread that has used torch's intra-op pool keeps an OpenMP team of its own, which
    slows every parallel region of the team that computes (docs/rollout.md); `thread` where
    rollouts overlap updates on purpose. Any other value is kept."""
    if driver != "auto":
        return driver
    return "caller" if cfg.trainer.pipeline == "on_policy" else "thread"


# The native engine samples with the model it is given; beside the trainer that is a copy.
@register_rollout_backend("native", NativeOptions, beside_trainer=_always, shares_model=True, records_routes=True,
                          multi_turn=True)
def native_engine(cfg: OmniConfig, model) -> RolloutEngine:
    r = cfg.rollout
    if isinstance(model, DiffusionModelBase):
        options = cfg.rollout.backend_options
        return NativeDiffusionEngine(model, r.max_num_seqs, options.max_wait_ms, options.trajectory_device,
                                     driver=native_driver(cfg, options.driver))
    if isinstance(model, AutoregressiveModelBase):
        return NativeTextEngine(model, r.max_num_seqs)
    raise TypeError(
        f"rollout.backend='native' has no engine for {type(model).__name__} (family {model.family!r}); "
        f"adapters derive from DiffusionModelBase or AutoregressiveModelBase"
    )


# Its own process and copy, synced by update_weights; its results are its engine's, routes included.
# Multi-turn: the native engine's generate_turns in the server, the agent loop here (server/turns.py).
@register_rollout_backend("server", ServerOptions, beside_trainer=_always, records_routes=True, multi_turn=True)
def server_engine(cfg: OmniConfig, model) -> RolloutEngine:
    return start_server_engine(cfg, model, cfg.rollout.backend_options)


def _start_from_trainer(engine: RolloutEngine, model) -> RolloutEngine:
    """Version 0 is the model's own trainable tensors (as the server client sends them), unless
    the model is a weightless view (inside the rollout server, whose client sends them)."""
    if not model.weightless:
        try:
            engine.update_weights(model.named_trainable_tensors(), 0, weight_kind(model))
        except BaseException:
            engine.close()
            raise
    return engine


def _check_family(backend: str, model, family: type, hint: str) -> None:
    if not isinstance(model, family):
        raise TypeError(
            f"rollout.backend={backend!r} has no engine for {type(model).__name__} (family {model.family!r}); {hint}"
        )


@register_rollout_backend("vllm_omni", VllmOmniOptions, beside_trainer=_own_process_only, loads_own_weights=True,
                          samples=DiffusionModelBase, packages=NEEDS["vllm_omni"])
def vllm_omni_engine(cfg: OmniConfig, model) -> RolloutEngine:
    _check_family("vllm_omni", model, DiffusionModelBase, "it samples diffusion models: use rollout.backend=vllm for text")
    options = cfg.rollout.backend_options
    if options.python is not None:
        return start_server_engine(cfg, model, options, backend="vllm_omni")
    from omni_rl.rollout.vllm_omni.availability import require
    from omni_rl.rollout.vllm_omni.engine import VllmOmniDiffusionEngine

    require("vllm_omni")
    return _start_from_trainer(VllmOmniDiffusionEngine(cfg, model, resolve_model_path(cfg.model.path, cfg.model.revision), options), model)


def _check_vllm_text(cfg: OmniConfig) -> None:
    """What vLLM's text engine cannot take besides a top-p nucleus (`takes_top_p=False`: the text
    family refuses that at load): LoRA in float32 (its LoRA kernels take fp16 / bf16 only) and a rank above its largest
    `max_lora_rank` (smaller ranks are rounded up to one it accepts)."""
    lora = cfg.model.lora
    if lora.enabled and cfg.model.dtype not in ("bfloat16", "float16"):
        raise ValueError(
            f"model.dtype={cfg.model.dtype!r} with model.lora.enabled=true: expected bfloat16 or float16 with "
            f"rollout.backend=vllm (vLLM's LoRA kernels take no other dtype); set model.dtype=bfloat16, or "
            f"model.lora.enabled=false to sync full weights in float32"
        )
    if lora.enabled and lora.rank > 512:
        raise ValueError(f"model.lora.rank={lora.rank}: expected at most 512 with rollout.backend=vllm "
                         f"(vLLM's largest max_lora_rank)")


# Routed experts: vLLM returns them, or its worker extension captures them (vllm_omni/text_engine.py).
# Multi-turn: each turn a vLLM request over the trajectory so far, its prefix from vLLM's prefix
# cache (vllm_omni/text_turns.py), in this process or behind the server (server/turns.py).
@register_rollout_backend("vllm", VllmOptions, beside_trainer=_own_process_only, loads_own_weights=True,
                          check_config=_check_vllm_text, takes_top_p=False, samples=AutoregressiveModelBase,
                          packages=NEEDS["vllm"], records_routes=True, multi_turn=True)
def vllm_engine(cfg: OmniConfig, model) -> RolloutEngine:
    _check_family("vllm", model, AutoregressiveModelBase, "it samples text models: use rollout.backend=vllm_omni for diffusion")
    options = cfg.rollout.backend_options
    if options.python is not None:
        return start_server_engine(cfg, model, options, backend="vllm")
    from omni_rl.rollout.vllm_omni.availability import require
    from omni_rl.rollout.vllm_omni.text_engine import VllmTextEngine

    require("vllm")
    return _start_from_trainer(VllmTextEngine(cfg, model, resolve_model_path(cfg.model.path, cfg.model.revision), options), model)

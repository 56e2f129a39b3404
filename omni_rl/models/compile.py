"""Compilation of a model's trained modules (`model.compile_options`), for rollout and training.

Regional by default: every block of the classes the adapter declares as its repeated blocks
(`OmniModelBase.compile_block_classes`, its FSDP blocks unless it says otherwise) is compiled with
`nn.Module.compile`, so one block's code is traced once and the others reuse it (diffusers'
`compile_repeated_blocks` does the same for the models that list `_repeated_blocks`). The blocks
are compiled after LoRA and gradient checkpointing are set up and before a sharded engine wraps
them (torchtitan's order: checkpoint, compile, shard). Shapes are dynamic by default, so the
native engine's changing batch never recompiles after the first compile; inductor's on-disk
cache is kept under `$OMNI_RL_CACHE/inductor` (or `cache_dir`), so a second run compiles from
it. Every recompile is logged by dynamo (`recompiles` logging is switched on).

Not here: CUDA-graph capture beyond what `mode=reduce-overhead` gives (GPU only), compiling the
frozen encoders and decoders (they run once per sample, not once per step), and ahead-of-time
packaging of compiled artifacts.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from omni_rl.errors import OmniConfigError
from omni_rl.option import ComponentOptions, option

log = logging.getLogger(__name__)

BACKENDS = ("inductor", "aot_eager", "eager")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Modes that capture CUDA graphs: refused on a device that has none.
GRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclass
class CompileOptions(ComponentOptions):
    """`model.compile_options`: whether and how the trained modules are compiled."""

    enabled: bool = option(False, "Compile the trained modules with torch.compile (rollout and training alike). Off by default: compiling costs tens of seconds per block class on a CPU and pays only over enough steps (docs/benchmarks.md, Compiled arm).")
    backend: str = option("inductor", "torch.compile backend: inductor (generated kernels: the speed-up), aot_eager (graph capture with eager kernels: checks the wiring, no speed-up), eager (dynamo only).")
    mode: str = option("default", "inductor's mode: default, max-autotune-no-cudagraphs, or reduce-overhead / max-autotune (CUDA graphs: GPU only).")
    regional: bool = option(True, "Compile each repeated block (the adapter's block classes) and let every block reuse its code; false compiles each trained module whole (slower to compile).")
    dynamic: bool = option(True, "Dynamic shapes from the first compile (the batch and sequence sizes), so the native engine's changing batch does not recompile; false lets dynamo specialise first and recompile once a size changes.")
    cache_dir: Optional[str] = option(None, "Inductor's on-disk cache (TORCHINDUCTOR_CACHE_DIR); null = the environment's TORCHINDUCTOR_CACHE_DIR where set, else $OMNI_RL_CACHE/inductor.")

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: expected one of {', '.join(MODES)}")
        if self.mode != "default" and self.backend != "inductor":
            raise ValueError(f"mode={self.mode!r}: a mode is inductor's; with backend={self.backend!r} leave mode "
                             f"default, or set backend: inductor")


def compile_options_of(cfg) -> CompileOptions:
    """`cfg.compile_options` of a `ModelConfig` as the composition root bound it, the defaults where a
    config written in code sets none, or rebuilt from the plain mapping of a bound instance that
    crossed a process boundary (`omni_rl.models.factory.options_from_data`)."""
    value = cfg.compile_options
    if isinstance(value, CompileOptions):
        return value
    if not value:
        return CompileOptions()
    raise OmniConfigError(
        f"model.compile_options={dict(value)!r}: expected the bound CompileOptions; compose the config with "
        f"omni_rl.compose.load_config, or set model.compile_options to a CompileOptions(...)"
    )


def inductor_cache_dir(options: CompileOptions) -> Path:
    """Where inductor keeps its compiled artifacts for this run (see `CompileOptions.cache_dir`)."""
    if options.cache_dir:
        return Path(options.cache_dir).expanduser()
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    from omni_rl.models.loading import cache_root

    return cache_root() / "inductor"


def compile_modules(modules: dict[str, nn.Module], block_classes: tuple[type, ...], options: CompileOptions,
                    device: torch.device) -> int:
    """Compile `modules` in place as `options` say; returns the number of modules compiled (blocks,
    or whole modules when `regional` is off or the adapter declares no block classes)."""
    if options.mode in GRAPH_MODES and device.type != "cuda":
        raise OmniConfigError(f"model.compile_options.mode={options.mode!r}: CUDA graphs need a CUDA device, the "
                              f"model is on {device}; use mode: default")
    # Read by inductor each time it looks for its cache (torch._inductor.runtime.cache_dir_utils).
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache_dir(options))
    torch._logging.set_logs(recompiles=True)
    kwargs = {"backend": options.backend, "dynamic": True if options.dynamic else None}
    if options.backend == "inductor":
        kwargs["mode"] = options.mode
    targets: list[nn.Module] = []
    for module in modules.values():
        blocks = [m for m in module.modules() if block_classes and isinstance(m, block_classes) and m is not module]
        targets += blocks if options.regional and blocks else [module]
    for target in targets:
        target.compile(**kwargs)
    log.info("compiled %d %s with backend %s (inductor cache %s)", len(targets),
             "blocks" if options.regional else "modules", options.backend, os.environ["TORCHINDUCTOR_CACHE_DIR"])
    return len(targets)


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])

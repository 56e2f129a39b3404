"""The weights part of a plan: build the recipe's model without weights, count what each rank holds.

`plan_weights(cfg)` builds the model on the meta device (the Ray driver's weightless build, with
the recipe's LoRA or trainable selection) from `architecture_folder(cfg.model.path)`, then lists
every parameter as the engine holds it: `fsdp2` shards the trainable root on every rank (fp32
master copies for a bf16/fp16 model) and keeps `frozen_modules()` whole; `local` shards nothing.
Where the folder lacks a file the build reads, the adapter's `PlanSpec` builds the trained
network(s) alone; without a spec it is a `PlanBuildError` (exit 2).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from omni_rl.config.options import recipe_values
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.device import weightless_device
from omni_rl.models.base import OmniModelBase
from omni_rl.plan.architecture import architecture_folder
from omni_rl.plan.memory import TensorSpec, weight_memory

# What a weights-only plan (`plan_weights`) leaves out; `omni_rl.plan.planner` traces the first
# two and says what it leaves out itself.
WEIGHTS_ONLY_NOT_COUNTED = (
    "activations and the all-gathered blocks of a forward (the trace: not yet)",
    "rollout tensors, stored trajectories, reward models (not yet)",
    "allocator fragmentation, the CUDA/NPU context, communication buffers",
)


class PlanBuildError(ConfigError):
    """The architecture folder lacks something the adapter's weightless build reads."""


@dataclass
class Built:
    """The recipe's adapter, weightless, and the frozen modules it holds (`complete`: the adapter's
    own full build ran; else only its trained network(s), through its `PlanSpec`, and the frozen
    ones its `load_frozen` builds)."""

    model: OmniModelBase
    frozen: list[torch.nn.Module]
    complete: bool
    missing: str = ""
    frozen_planned: bool = True  # False: the frozen encoders and decoders are not counted


def build_weightless(cfg: OmniConfig, folder: Path) -> Built:
    """The recipe's adapter built on the meta device from `folder`'s configuration files; when the
    folder lacks what the full build reads (a shipped architecture folder has no tokenizers and
    not every encoder's config), its trained network(s) alone (`omni_rl.plan.spec`)."""
    from omni_rl.models.factory import build_model
    from omni_rl.models.loading import ModelFolderError

    model_cfg = dataclasses.replace(cfg.model, path=str(folder))
    try:
        model = build_model(model_cfg, weightless_device(), tuple(cfg.plugins))
        return Built(model, list(model.frozen_modules()), True)
    except (OSError, ValueError, KeyError, AttributeError, ModelFolderError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        why = f"{type(err).__name__}: {first[:300]}"
    return _build_trained_only(cfg, model_cfg, folder, why)


def _build_trained_only(cfg: OmniConfig, model_cfg, folder: Path, why: str) -> Built:
    from omni_rl.models.registry import ADAPTERS, adapter_key
    from omni_rl.plan.spec import PLAN_SPECS

    key = adapter_key(model_cfg.adapter, model_cfg.stage)
    if key not in PLAN_SPECS:
        raise PlanBuildError(
            f"model.path={cfg.model.path!r}: the weightless build of {key} from {folder} failed ({why}) and the "
            f"adapter registers no plan spec to build its trained network alone; the folder needs every config file "
            f"the adapter reads"
        )
    adapter = ADAPTERS.get(key).__new__(ADAPTERS.get(key))
    OmniModelBase.__init__(adapter, model_cfg, str(folder), weightless_device())
    spec = PLAN_SPECS.get(key)
    try:
        spec.load_trained(adapter)
        frozen = spec.load_frozen(adapter) if spec.load_frozen is not None else []
    except (OSError, ValueError, KeyError) as err:
        raise PlanBuildError(
            f"model.path={cfg.model.path!r}: building {key}'s trained network from {folder} failed "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); the folder needs its config"
        ) from err
    adapter.setup_trained_modules()
    for module in frozen:
        module.requires_grad_(False)
    return Built(adapter, frozen, False, why, frozen_planned=spec.load_frozen is not None)


def world_size(cfg: OmniConfig) -> int:
    """FSDP2 ranks: the actor group's world (`trainer.backend_options`); 1 for the local engine."""
    if cfg.trainer.engine != "fsdp2":
        return 1
    from omni_rl.trainer.ray_actors import RayOptions

    options = cfg.trainer.backend_options
    return options.world_size if isinstance(options, RayOptions) else 1


def offloads(cfg: OmniConfig) -> tuple[bool, bool]:
    """(param_offload, optimizer_offload) of the engine's options (False for an engine without them)."""
    from omni_rl.engine.registry import FSDP2Options

    options = cfg.trainer.engine_options
    return (options.param_offload, options.optimizer_offload) if isinstance(options, FSDP2Options) else (False, False)


def engine_tensors(model: OmniModelBase, engine: str, frozen: list[torch.nn.Module]) -> Iterator[TensorSpec]:
    """Every parameter of the adapter, each once, as `engine` holds it (module docstring)."""
    root = model.trainable_root()
    in_root = {id(p) for p in root.parameters()}
    upcast = engine == "fsdp2" and model.dtype != torch.float32
    seen: set[int] = set()
    for module in (root, *frozen):
        for name, p in module.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            dtype = torch.float32 if (p.requires_grad and upcast) else p.dtype
            yield TensorSpec(name, tuple(p.shape), dtype, p.requires_grad, sharded=engine == "fsdp2" and id(p) in in_root)


def plan_weights(cfg: OmniConfig) -> dict[str, Any]:
    """The weights plan of `cfg` as a JSON-able dict (module docstring)."""
    folder = architecture_folder(cfg.model.path)
    plan = weights_of(cfg, folder, build_weightless(cfg, folder))
    plan["not_counted"][:0] = WEIGHTS_ONLY_NOT_COUNTED
    return plan


def weights_of(cfg: OmniConfig, folder: Path, built: Built) -> dict[str, Any]:
    """The weights plan of `cfg` for an already built model (its `not_counted` names only what the
    build left out)."""
    t = cfg.trainer
    tensors = list(engine_tensors(built.model, t.engine, built.frozen))
    param_offload, optimizer_offload = offloads(cfg)
    memory = weight_memory(tensors, world_size(cfg), param_offload, optimizer_offload)
    count = sum(torch.Size(s.shape).numel() for s in tensors)
    trainable = sum(torch.Size(s.shape).numel() for s in tensors if s.trainable)
    return {
        "recipe": cfg.recipe,
        "model": {"adapter": cfg.model.adapter, "path": cfg.model.path, "architecture_folder": str(folder),
                  "dtype": cfg.model.dtype, "lora": cfg.model.lora.enabled},
        "devices": {"backend": t.backend, "engine": t.engine, "backend_options": recipe_values(t.backend_options),
                    "world_size": world_size(cfg),
                    "param_offload": param_offload, "optimizer_offload": optimizer_offload},
        "parameters": {"total": count, "trainable": trainable, "frozen": count - trainable},
        "per_device_bytes": memory.to_dict(),
        "built": "the adapter's full weightless build" if built.complete else
                 f"the trained network(s) only (the full build needs files the folder lacks: {built.missing})",
        # What this build leaves out; the caller adds what its own part of the plan leaves out.
        "not_counted": [] if built.complete or built.frozen_planned else
                       ["frozen encoders and decoders (text encoders, VAE): their configs are not in the folder"],
    }


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _count(n: int) -> str:
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def format_table(plan: dict[str, Any]) -> str:
    """The plan as console lines."""
    p, d, m = plan["parameters"], plan["devices"], plan["per_device_bytes"]
    rows = [("frozen weights", "frozen_weights"), ("trainable weights", "trainable_weights"),
            ("gradients", "gradients"), ("optimizer state", "optimizer_state"), ("total (weights only)", "device_total")]
    host = [("weights", "host_weights"), ("gradients", "host_gradients"), ("optimizer state", "host_optimizer_state")]
    lines = [
        f"plan: {plan['recipe']} ({plan['model']['adapter']}, {plan['model']['path']})",
        f"  parameters: {_count(p['total'])} total, {_count(p['trainable'])} trainable",
        f"  devices: {d['engine']} on {d['world_size']} rank(s) (backend {d['backend']}, "
        f"param_offload={d['param_offload']}, optimizer_offload={d['optimizer_offload']})",
        "  per device:",
        *(f"    {label:<22}{_size(m[key]):>12}" for label, key in rows),
        "  host, per rank:",
        *(f"    {label:<22}{_size(m[key]):>12}" for label, key in host),
        "  not counted: " + "; ".join(plan["not_counted"]),
    ]
    return "\n".join(lines)

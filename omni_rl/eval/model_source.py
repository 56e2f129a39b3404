"""What `--eval-model` names, its identity for results, and how it is loaded into the recipe's model.

The recipe's base model, a run's checkpoint or output folder (optionally its EMA), or a LoRA in
diffusers or PEFT format. `identity` names the kind, the path and every weight file's sha256; a
LoRA that fits no layer of the model is one error before any sample is drawn.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omni_rl.errors import OmniConfigError
from omni_rl.models.checksums import sha256_of

LORA_FILES = ("pytorch_lora_weights.safetensors", "adapter_model.safetensors")


class EvalModelError(OmniConfigError):
    """`--eval-model` names nothing loadable, or weights that do not fit the recipe's model."""


@dataclass(frozen=True)
class ModelSource:
    kind: str                       # "base", "checkpoint" or "lora"
    path: Optional[Path] = None     # the checkpoint folder, or the LoRA file
    files: tuple[Path, ...] = ()    # the weight files the identity hashes
    weights: str = "trained"        # a checkpoint's "trained" tensors or their "ema"


WEIGHTS = ("trained", "ema")


def resolve_source(arg: Optional[str], weights: str = "trained") -> ModelSource:
    """The `ModelSource` an `--eval-model` value names (checked on disk; nothing is loaded), with
    `--eval-weights` (`trained`, or a checkpoint's `ema`)."""
    if weights not in WEIGHTS:
        raise EvalModelError(f"--eval-weights {weights!r}: expected trained or ema (a checkpoint's moving average)")
    if weights == "ema" and arg is None:
        raise EvalModelError("--eval-weights ema needs --eval-model naming a checkpoint of a run that kept an EMA "
                             "(trainer.backend_options.ema_decay)")
    source = _resolve(arg)
    if weights == "ema" and source.kind != "checkpoint":
        raise EvalModelError(f"--eval-weights ema reads a checkpoint's EMA, and --eval-model {arg!r} is a {source.kind}; "
                             f"name the checkpoint (an exported EMA LoRA is its own --eval-model: OUTPUT/lora/ema)")
    return dataclasses.replace(source, weights=weights)


def _resolve(arg: Optional[str]) -> ModelSource:
    if arg is None:
        return ModelSource("base")
    path = Path(arg).expanduser()
    if not path.exists():
        raise EvalModelError(f"--eval-model {arg!r} does not exist; name a checkpoint folder, a run's output folder, "
                             f"or a LoRA ({' or '.join(LORA_FILES)}, or its folder)")
    if path.is_file():
        if path.suffix != ".safetensors":
            raise EvalModelError(f"--eval-model {arg!r} is a {path.suffix or 'suffix-less'} file; expected a LoRA "
                                 f".safetensors file or a folder")
        return ModelSource("lora", path, (path,))
    for name in LORA_FILES:
        if (path / name).is_file():
            return ModelSource("lora", path / name, (path / name,))
    from omni_rl.trainer.checkpoint import CheckpointError, find_checkpoint

    try:
        folder = find_checkpoint(str(path), "--eval-model")
    except CheckpointError as err:
        raise EvalModelError(f"--eval-model {arg!r} holds no LoRA file ({', '.join(LORA_FILES)}) and no checkpoint: "
                             f"{err}") from None
    return ModelSource("checkpoint", folder, tuple(sorted(p for p in folder.rglob("*.safetensors"))))


def identity(source: ModelSource, cfg) -> dict[str, Any]:
    """What was evaluated: the recipe's model and adapter, and the weights on top (kind, path, sha256)."""
    out: dict[str, Any] = {"model.path": cfg.model.path, "model.adapter": cfg.model.adapter,
                           "model.stage": cfg.model.stage, "weights": source.kind}
    if source.weights != "trained":
        out["tensors"] = source.weights
    if source.path is not None:
        out["path"] = str(source.path)
        out["sha256"] = {str(p.relative_to(source.path) if p != source.path else p.name): sha256_of(p)
                         for p in source.files}
    return out


def model_config_for(source: ModelSource, cfg):
    """The recipe's model config as the source needs it built: without the recipe's LoRA for a
    foreign LoRA (the file brings its own rank, alpha and targets)."""
    if source.kind != "lora":
        return cfg.model
    return dataclasses.replace(cfg.model, lora=dataclasses.replace(cfg.model.lora, enabled=False))


def load_source(source: ModelSource, model, cfg) -> None:
    """Put the source's weights into `model` (built from `model_config_for(source, cfg)`)."""
    if source.kind == "checkpoint":
        _load_checkpoint(source, model, cfg)
    elif source.kind == "lora":
        _load_lora(source, model)


def _load_checkpoint(source: ModelSource, model, cfg) -> None:
    from omni_rl.trainer.checkpoint import CheckpointError, check_compatible, checkpoint_ema_tensors, load_checkpoint

    state = load_checkpoint(str(source.path))
    if "sharded" in state:
        raise EvalModelError(f"--eval-model {str(source.path)!r} is a sharded (Ray) checkpoint; export its weights "
                             f"with omni_rl.trainer.sharded_export.export_sharded_checkpoint and evaluate that LoRA")
    tensors = state["trainable"]
    if source.weights == "ema":
        tensors = checkpoint_ema_tensors(state)
        if tensors is None:
            raise EvalModelError(f"--eval-weights ema: checkpoint {str(source.path)!r} holds no EMA (its run had no "
                                 f"trainer.backend_options.ema_decay); evaluate its trained weights (drop --eval-weights)")
    try:
        check_compatible(state, cfg, model)
        model.load_named_tensors(tensors)
    except (CheckpointError, KeyError, RuntimeError, ValueError) as err:
        raise EvalModelError(f"--eval-model {str(source.path)!r} does not fit recipe model {cfg.model.path!r}: {err}; "
                             f"evaluate it with the recipe it was trained with") from None


def _lora_layers(tensors: dict) -> dict[str, tuple[Any, Any]]:
    """module path -> (lora_A shape, lora_B shape) of a diffusers / PEFT LoRA state dict."""
    layers: dict[str, list] = {}
    for key, shape in tensors.items():
        for part, slot in ((".lora_A.", 0), (".lora_B.", 1), (".lora_down.", 0), (".lora_up.", 1)):
            if part in key:
                layers.setdefault(key.split(part)[0], [None, None])[slot] = shape
    return {k: (v[0], v[1]) for k, v in layers.items()}


def _load_lora(source: ModelSource, model) -> None:
    from safetensors import safe_open
    from torch import nn

    with safe_open(str(source.path), framework="pt") as f:
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
        metadata = f.metadata() or {}
    layers = _lora_layers(shapes)
    if not layers:
        raise EvalModelError(f"--eval-model {str(source.path)!r} holds no LoRA tensors (no lora_A / lora_B keys among "
                             f"{len(shapes)} tensors); expected a diffusers or PEFT LoRA file")
    for component, module in model.trainable_modules().items():
        prefix = _prefix_of(layers, component)
        mine = {k[len(prefix):]: v for k, v in layers.items() if k.startswith(prefix)}
        if not mine:
            continue
        named = dict(module.named_modules())
        for path, (a, b) in sorted(mine.items()):
            layer = named.get(path)
            if not isinstance(layer, nn.Linear):
                raise EvalModelError(
                    f"--eval-model {str(source.path)!r} does not fit model {model.path!r}: its LoRA key {prefix}{path} "
                    f"names no linear layer of the {component} ({type(module).__name__}); is it a LoRA of another model?")
            if a is None or b is None or a[1] != layer.in_features or b[0] != layer.out_features:
                raise EvalModelError(
                    f"--eval-model {str(source.path)!r} does not fit model {model.path!r}: LoRA {prefix}{path} has shapes "
                    f"A {a}, B {b}, the layer is {layer.in_features} -> {layer.out_features}; is it a LoRA of another model?")
        _attach(source, module, component, prefix, metadata)
        return
    raise EvalModelError(f"--eval-model {str(source.path)!r}: none of its LoRA keys (e.g. {next(iter(layers))}) belongs "
                         f"to the trained module(s) {sorted(model.trainable_modules())} of {model.path!r}")


def _prefix_of(layers: dict, component: str) -> str:
    """The key prefix the LoRA gives `component`'s layers: diffusers' `<component>.`, PEFT's
    `base_model.model.`, or none."""
    for prefix in (f"{component}.", "base_model.model.", ""):
        if any(k.startswith(prefix) for k in layers):
            return prefix
    return ""


def _attach(source: ModelSource, module, component: str, prefix: str, metadata: dict) -> None:
    """Load the file through the module's own library, which reads rank and alpha from it."""
    try:
        from diffusers.models.modeling_utils import ModelMixin
    except ImportError:  # a text-only install
        ModelMixin = ()
    if ModelMixin and isinstance(module, ModelMixin):
        module.load_lora_adapter(str(source.path.parent), weight_name=source.path.name,
                                 prefix=prefix.rstrip(".") or None, adapter_name="evaluated")
        return
    config = source.path.parent / "adapter_config.json"
    if not config.is_file():
        raise EvalModelError(f"--eval-model {str(source.path)!r}: a PEFT LoRA of a language model needs its "
                             f"adapter_config.json beside it (rank, alpha, targets); none in {source.path.parent}")
    json.loads(config.read_text())  # unreadable JSON fails here with its own message
    module.load_adapter(str(source.path.parent), adapter_name="evaluated")
    module.set_adapter("evaluated")

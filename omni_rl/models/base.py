"""`OmniModelBase`: the contract every model adapter implements, whatever its family.

An adapter owns a loaded model and says which module trains, where LoRA goes, which blocks FSDP
wraps, which tensors a rollout engine needs after an update, and how the model computes the same
numbers in rollout and training (dropout off in both). `DiffusionModelBase` and
`AutoregressiveModelBase` add what their kind of model needs.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Iterator, Optional

import torch
from torch import nn

from omni_rl.config.options import NoOptions
from omni_rl.config.schema import ModelConfig
from omni_rl.device import is_weightless
from omni_rl.errors import OmniConfigError
from omni_rl.models.registry import adapter_key

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class OptimizerGroup:
    """Trained parameters that one optimizer group updates with its own learning rate and its own
    gradient clip (`OmniModelBase.optimizer_groups`)."""

    name: str
    params: list
    lr: Optional[float] = None  # None: optim.lr


class OmniModelBase(ABC):
    """Base of all adapters. Subclasses load their weights in `__init__` from `self.path`, each
    network through `self.load_pretrained(cls, subfolder)`: an adapter built on the meta device
    (`weightless`) then reads configs, tokenizers and processors but no weights, which is all
    the Ray driver needs (prompts, shapes, names) while the workers hold the weights."""

    family: ClassVar[str] = ""
    # LoRA target module names used when `model.lora.target_modules` is null.
    default_lora_targets: ClassVar[tuple[str, ...]] = ()
    # Where `trainable_root()`'s parameter names sit in the checkpoint's own naming (a model
    # trained as part of a larger checkpoint: Qwen3-Omni's thinker is "thinker."); engines that
    # load checkpoint-named weights themselves (vLLM) prepend it.
    checkpoint_prefix: ClassVar[str] = ""
    # The adapter's own knobs (`model.adapter_options`): a dataclass of `omni_rl.option.option` fields,
    # with an optional `check()`. `omni_rl.compose` binds the block at load (a bad key or value
    # fails before any weights) and the adapter takes that instance (`self.options`).
    options_class: ClassVar[type] = NoOptions
    # The keys this model adds to each sample's reward metadata beyond the prompt row's (a talker
    # stage: "spoken_text", the text it was asked to say). A reward that needs a key
    # (`register_reward(needs_metadata=...)`) is refused at load when neither the model adds it
    # nor every prompt row carries it (`omni_rl.reward.prompt_checks.check_reward_prompts`).
    sample_metadata_keys: ClassVar[frozenset[str]] = frozenset()
    # Whether its samples carry sound an audio reward can score: a diffusion model that decodes
    # it with `decode_audio` (LTX-2), a talker that speaks (`SpeechModelBase`).
    makes_audio: ClassVar[bool] = False

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        self.cfg = cfg
        self.options = self.bound_options(cfg)
        self.path = path
        self.device = device
        self.dtype = _DTYPES[cfg.dtype]

    @classmethod
    def bound_options(cls, cfg: ModelConfig):
        """The adapter's options: `cfg.adapter_options` as the composition root bound it (an instance of
        `options_class`), or the defaults where a model config written in code sets none. A recipe
        mapping that was never bound is refused (its values were never checked)."""
        if isinstance(cfg.adapter_options, cls.options_class):
            return cfg.adapter_options
        if not cfg.adapter_options:
            return cls.options_class()
        raise OmniConfigError(
            f"model.adapter_options={dict(cfg.adapter_options)!r}: expected the bound options of model adapter "
            f"{adapter_key(cfg.adapter, cfg.stage)} ({cls.options_class.__name__}); compose the config with "
            f"omni_rl.compose.load_config, or set model.adapter_options to a {cls.options_class.__name__}(...)"
        )

    @classmethod
    def check_config(cls, cfg) -> None:
        """Refuse, with `ValueError` naming the key and the valid values, what the config alone
        shows this architecture cannot take (run at config load, before any weights)."""

    @classmethod
    def check_model_limits(cls, cfg, configs) -> None:
        """Refuse, with `ValueError` naming the key, the limit and the largest valid value, a setting
        past what the model's configs say it can take (`configs.get(component)`: a config.json dict or
        None); run before the model loads (`omni_rl.models.geometry.check_model_geometry`). None by default.
        """

    @property
    def weightless(self) -> bool:
        """Built on the meta device: the architecture without weights (see `load_pretrained`)."""
        return is_weightless(self.device)

    def load_pretrained(self, cls, subfolder: str | None = None) -> nn.Module:
        """`cls.from_pretrained(self.path, subfolder)` in the adapter's dtype (on the host), or
        a meta-device skeleton from its config alone when the adapter is weightless."""
        from omni_rl.models.pretrained import load_pretrained

        return load_pretrained(cls, self.path, self.dtype, subfolder, weights=not self.weightless)

    # --- what trains -------------------------------------------------------------------
    def trainable_module(self) -> nn.Module:
        """The module whose parameters (or LoRA adapters) the optimizer updates. Adapters of
        models with one such module override this; models with several (Wan2.2 A14B's two
        experts) override `trainable_modules` instead."""
        raise NotImplementedError(
            f"{type(self).__name__} must override trainable_module() (one trained module) or "
            f"trainable_modules() (several)"
        )

    def trainable_modules(self) -> dict[str, nn.Module]:
        """Every module the optimizer updates, by its pipeline component name, in a fixed order."""
        return {"transformer": self.trainable_module()}

    def trainable_root(self) -> nn.Module:
        """One module holding everything that trains: the trained module itself when there is one
        (parameter names unchanged), else an `nn.ModuleDict` of them, whose parameter names start
        with the component name (`transformer_2.blocks.0...`). Parameters, weight sync,
        checkpoints and sharded state all name tensors through it."""
        modules = self.trainable_modules()
        if len(modules) == 1:
            return next(iter(modules.values()))
        root = self.__dict__.get("_trainable_root")
        if root is None or dict(root.items()) != modules:
            root = self.__dict__["_trainable_root"] = nn.ModuleDict(modules)
        return root

    def fsdp_wrap_classes(self) -> tuple[type[nn.Module], ...]:
        """Block classes that FSDP should shard one by one (a hint for sharded engines)."""
        return ()

    def compile_block_classes(self) -> tuple[type[nn.Module], ...]:
        """The repeated block classes that regional compilation compiles one by one
        (`model.compile_options`): the FSDP blocks unless an adapter says otherwise."""
        return self.fsdp_wrap_classes()

    def lora_targets(self) -> list[str]:
        return list(self.cfg.lora.target_modules or self.default_lora_targets)

    def setup_trainable(self) -> None:
        """Freeze everything, then add LoRA to each trained module (or unfreeze them whole)."""
        for part in self.frozen_modules():
            part.requires_grad_(False)
        self.setup_trained_modules()
        self.set_eval_mode()

    def setup_trained_modules(self) -> None:
        """`setup_trainable` on the trained modules alone (LoRA or the whole module, checkpointing, eval
        mode). The planner calls it on an adapter holding only those, so an adapter that trains part of
        a module overrides this, not `setup_trainable`.
        """
        lora = self.cfg.lora
        for module in self.trainable_modules().values():
            module.requires_grad_(False)
            if lora.enabled:
                from peft import LoraConfig

                check_lora_targets(module, self.lora_targets(), self.default_lora_targets)
                module = self.add_lora(
                    module,
                    LoraConfig(
                        r=lora.rank,
                        lora_alpha=lora.alpha,
                        target_modules=self.lora_targets(),
                        init_lora_weights="gaussian" if lora.init == "gaussian" else True,
                    ),
                )
                # PEFT keeps adapter weights in the base dtype; train them in fp32 so small
                # updates (lr * grad ~ 1e-7) are not rounded away in bf16.
                for p in module.parameters():
                    if p.requires_grad:
                        p.data = p.data.float()
            else:
                module.requires_grad_(True)
            if self.cfg.gradient_checkpointing:
                self.enable_checkpointing(module)
            module.eval()
        self.compile_trained_modules()

    def compile_trained_modules(self) -> int:
        """Compile the trained modules as `model.compile_options` say (after LoRA and checkpointing,
        before a sharded engine wraps the blocks); returns how many modules were compiled (0: off)."""
        from omni_rl.models.compile import compile_modules, compile_options_of

        options = compile_options_of(self.cfg)
        if not options.enabled or self.weightless:
            return 0
        return compile_modules(self.trainable_modules(), tuple(self.compile_block_classes()), options, self.device)

    def enable_checkpointing(self, module: nn.Module) -> None:
        """Recompute activations in the backward pass (diffusers' spelling; families override)."""
        module.enable_gradient_checkpointing()

    def add_lora(self, module: nn.Module, config) -> nn.Module:
        """Attach LoRA to `module` and return the module that now trains. diffusers models take
        PEFT adapters in place (`add_adapter`); families override this where their library
        wraps the model instead."""
        module.add_adapter(config)
        return module

    @contextlib.contextmanager
    def lora_disabled(self) -> Iterator[None]:
        modules = list(self.trainable_modules().values())
        for module in modules:
            module.disable_adapters()
        try:
            yield
        finally:
            for module in modules:
                module.enable_adapters()

    def frozen_modules(self) -> list[nn.Module]:
        """Every other module the adapter holds (encoders, decoders); never trained."""
        return []

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.trainable_root().parameters() if p.requires_grad]

    def optimizer_groups(self) -> list[OptimizerGroup]:
        """The trained parameters by optimizer group: one, the whole policy, for a model; one per
        model where an adapter holds two trained models (a prompt writer and an image model,
        `omni_rl.models.write_draw`), each with its own learning rate and gradient clip."""
        return [OptimizerGroup("policy", self.trainable_parameters())]

    def named_trainable_tensors(self) -> dict[str, torch.Tensor]:
        """What a separate rollout engine needs after an update: LoRA tensors only when LoRA
        is on (the fast path), otherwise the full weights of the trainable module."""
        return {n: p.detach() for n, p in self.trainable_root().named_parameters() if p.requires_grad}

    @torch.no_grad()
    def load_named_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        params = dict(self.trainable_root().named_parameters())
        missing = sorted(set(tensors) - set(params))
        if missing:
            raise KeyError(f"weight sync: {len(missing)} tensors have no parameter here, e.g. {missing[:3]}")
        for name, value in tensors.items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))

    # --- reference policy and alignment ------------------------------------------------
    @contextlib.contextmanager
    def reference_policy(self) -> Iterator[None]:
        """Within this block the model is the reference (base) policy: LoRA disabled."""
        if not self.cfg.lora.enabled:
            raise RuntimeError("the reference policy is the base model with LoRA disabled; model.lora.enabled=false has none")
        with self.lora_disabled():
            yield

    def set_eval_mode(self) -> None:
        """Dropout off everywhere, in rollout and training alike: the trainer must recompute
        exactly the function that sampled (the on-policy ratio is 1)."""
        for module in self.trainable_modules().values():
            module.eval()
        for part in self.frozen_modules():
            part.eval()

    # --- saving ------------------------------------------------------------------------
    @abstractmethod
    def save_lora(self, folder: str) -> None:
        """Write the LoRA weights in the format of the model's own library."""

    def save_full(self, folder: str) -> None:
        """Write each fully fine-tuned module with its library's `save_pretrained`: into `folder`
        itself when one module trains, into `folder/<component>` (a pipeline's layout) when several do."""
        modules = self.trainable_modules()
        if len(modules) == 1:
            next(iter(modules.values())).save_pretrained(folder)
            return
        for name, module in modules.items():
            module.save_pretrained(f"{folder}/{name}")

    def save_trained(self, folder: str) -> None:
        """What a run exports: the LoRA weights when LoRA is on, else the whole trained module."""
        if self.cfg.lora.enabled:
            self.save_lora(folder)
        else:
            self.save_full(folder)


class LoraTargetError(OmniConfigError):
    """`model.lora.target_modules` names modules the model does not have."""


def check_lora_targets(module: nn.Module, targets, defaults) -> None:
    """Refuse, in one line, target names that match no module of `module` as PEFT matches them
    (a module's full name, or its name ending in "." + target), before PEFT raises its own long
    traceback. A string target is PEFT's regular expression: left to PEFT."""
    if isinstance(targets, str):
        return
    names = [name for name, _ in module.named_modules() if name]
    missing = [t for t in targets if not any(name == t or name.endswith(f".{t}") for name in names)]
    if missing:
        linear = sorted({name.rsplit(".", 1)[-1] for name, m in module.named_modules() if isinstance(m, nn.Linear)}
                        - {str(i) for i in range(10_000)})  # a Sequential's indices name nothing
        raise LoraTargetError(
            f"model.lora.target_modules={list(targets)}: {missing} match no module of the trained "
            f"{type(module).__name__} (its linear layers are named {', '.join(linear[:12])}"
            f"{', ...' if len(linear) > 12 else ''}); name some of those, or null for the adapter's default "
            f"{list(defaults)}"
        )

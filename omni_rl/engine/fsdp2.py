"""`FSDP2Engine`: the sharded training engine (torch `fully_shard`), one per data-parallel rank.

Same interface as `LocalEngine`: the trainable module is sharded block by block
(`fsdp_wrap_classes()`) then at the root, with fp32 master shards, optional host offload, DCP
checkpoints that load on any number of ranks and per-block gradient checkpointing.
Not here: tensor / sequence parallelism, HSDP across nodes.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from omni_rl.config.schema import OptimConfig
from omni_rl.engine.base import LossFn, Metric, TrainingEngine, all_finite, apply_optim_config
from omni_rl.engine.local import detached, refuse_if_not_finite
from omni_rl.models.base import OmniModelBase
from omni_rl.utils.tensor_buckets import named_buckets

# Only what trains is saved; the frozen base weights come from the model path on load.
_STATE_OPTIONS = StateDictOptions(ignore_frozen_params=True)
# Loading such a state leaves the frozen weights as they are (DCP itself refuses a checkpoint
# that lacks a requested trainable tensor).
_LOAD_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly sharded) parameter: a collective when it is a DTensor,
    so every rank must call it for the same tensors in the same order."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def shard_model(module: torch.nn.Module, wrap_classes: tuple[type, ...], mp: MixedPrecisionPolicy | None,
                offload: OffloadPolicy, activation_checkpointing: bool = False) -> int:
    """`fully_shard` every block of the given classes, then the root; returns the block count.

    A `ModuleDict` of several trained modules (`OmniModelBase.trainable_root`) is never called
    itself: each of its modules is sharded as a root of its own, since FSDP2 unshards a root's
    parameters in that root's forward."""
    from torch.distributed._composable import checkpoint

    kwargs: dict[str, Any] = {"offload_policy": offload}
    if mp is not None:
        kwargs["mp_policy"] = mp
    blocks = [m for m in module.modules() if wrap_classes and isinstance(m, wrap_classes) and m is not module]
    for block in blocks:
        if activation_checkpointing:
            checkpoint(block)
        fully_shard(block, **kwargs)
    for root in module.values() if isinstance(module, torch.nn.ModuleDict) else [module]:
        fully_shard(root, **kwargs)
    return len(blocks)


class FSDP2Engine(TrainingEngine):
    def __init__(self, model: OmniModelBase, cfg: OptimConfig, param_offload: bool = False,
                 optimizer_offload: bool = False):
        if not dist.is_initialized():
            raise RuntimeError(
                "FSDP2Engine needs a torch.distributed process group; it is built inside a Ray worker "
                "(trainer.backend=ray), which initialises one. For one process use LocalEngine."
            )
        self.model = model
        self.cfg = cfg
        self.device = model.device
        module = model.trainable_root()
        if not any(p.requires_grad for p in module.parameters()):
            raise ValueError("the model has no trainable parameters; check model.lora or the adapter's trainable_module")
        mp = None
        if model.dtype != torch.float32:
            # Trainable parameters keep fp32 master shards (frozen ones stay in model.dtype);
            # FSDP all-gathers everything in model.dtype for the forwards.
            for p in module.parameters():
                if p.requires_grad:
                    p.data = p.data.float()
            mp = MixedPrecisionPolicy(param_dtype=model.dtype, reduce_dtype=torch.float32)
        offload = CPUOffloadPolicy(pin_memory=self.device.type != "cpu") if param_offload else OffloadPolicy()
        self.num_blocks = shard_model(
            module, tuple(model.fsdp_wrap_classes()), mp, offload, model.cfg.gradient_checkpointing
        )
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, eps=cfg.eps
        )
        self.optimizer_offload = optimizer_offload and not param_offload and self.device.type != "cpu"
        self.optimizer.zero_grad(set_to_none=True)
        self._losses_finite = None  # since the last optimizer step (engine/base.py)

    def forward_backward(self, micro_batch: Any, loss_fn: LossFn, loss_scale: float = 1.0) -> dict[str, Metric]:
        loss, metrics = loss_fn(micro_batch)
        self._losses_finite = all_finite(self._losses_finite, loss)
        (loss * loss_scale).backward()
        return detached(metrics)

    def optimizer_step(self) -> dict[str, Metric]:
        grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm))
        # A non-finite gradient norm is the same total on every rank: all skip together. A
        # non-finite loss is this rank's: the worker group turns its error into a failed step.
        refuse_if_not_finite(self.optimizer, self._losses_finite, grad_norm, f"rank {dist.get_rank()}: ")
        self._losses_finite = None
        self._move_optimizer_state(self.device)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.optimizer_offload:
            self._move_optimizer_state(torch.device("cpu"))
        return {"actor/grad_norm": grad_norm.detach(), "actor/lr": self.optimizer.param_groups[0]["lr"]}

    def _move_optimizer_state(self, device: torch.device) -> None:
        if not self.optimizer_offload:
            return
        for state in self.optimizer.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and k != "step":
                    state[k] = v.to(device, non_blocking=True)

    # --- weights -------------------------------------------------------------------------
    def trainable_buckets(self, bucket_bytes: int):
        """Yield {name: full tensor} groups of at most `bucket_bytes` (one tensor may exceed it):
        the full weights leave the shards a bucket at a time. A collective: all ranks iterate."""
        gathered = ((name, full_tensor(p)) for name, p in self.model.named_trainable_tensors().items())
        yield from named_buckets(gathered, bucket_bytes)

    def full_trainable_tensors(self) -> dict[str, torch.Tensor]:
        """Every trainable tensor, whole, on the host (a collective)."""
        return {k: v.detach().cpu().clone() for b in self.trainable_buckets(1 << 62) for k, v in b.items()}

    # --- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Trainable tensors and optimizer state as sharded DTensors (for `dcp.save`)."""
        model_state, optim_state = get_state_dict(self.module, self.optimizer, options=_STATE_OPTIONS)
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.module, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
            options=_LOAD_OPTIONS,
        )
        # The config's lr, not the checkpoint's: every rank sets it, rank 0 says so.
        apply_optim_config(self.optimizer, self.cfg, say=dist.get_rank() == 0)

    def save_sharded(self, folder: str) -> None:
        """Every rank writes its shards into `folder` (a path all ranks see)."""
        dcp.save(self.state_dict(), checkpoint_id=folder)

    def load_sharded(self, folder: str) -> None:
        state = self.state_dict()  # the layout to load into; DCP reshards to it
        dcp.load(state, checkpoint_id=folder)
        self.load_state_dict(state)


def load_sharded_trainable(model: OmniModelBase, folder: str) -> None:
    """Load a sharded checkpoint's trainable tensors into an unsharded model, in one process
    (no process group): how weights are exported from a sharded checkpoint."""
    module = model.trainable_root()
    loaded = {"model": {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}}
    with warnings.catch_warnings():  # one process without a process group is the intent here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(loaded, checkpoint_id=folder)  # fills the tensors in place; only these keys are read
    model.load_named_tensors(loaded["model"])

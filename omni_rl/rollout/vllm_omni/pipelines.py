"""vLLM-Omni custom pipelines that sample with our adapters: one class per adapter family.

vLLM-Omni builds the class named in `custom_pipeline_args`, loads its weights and calls
`forward(DiffusionRequestBatch) -> list[DiffusionOutput]` on each scheduled batch. Here that is
glue around `DiffusionPipelineCore`, plain torch: it builds our adapter from
`custom_pipeline_args["omni_rl"]` and samples with `diffusion_sampling.sample_requests`, the
native engine's per-request maths, splitting the batch per request (`codec.py` says why).
Weight updates arrive through `worker.py` into `load_trainer_tensors`. docs/rollout.md says
why the adapter is built under fp32, why sampling is always eager and why vLLM-Omni's LoRA
manager is not used.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, ClassVar, Iterator, Optional, Sequence

import torch
from omegaconf import OmegaConf
from torch import nn

from omni_rl.config.schema import ModelConfig
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.models.factory import build_model, options_from_data
from omni_rl.rollout.base import check_weight_kind
from omni_rl.rollout.diffusion_sampling import sample_requests
from omni_rl.rollout.types import DiffusionResult
from omni_rl.rollout.vllm_omni.codec import request_from_prompt, result_to_output

# The adapter architecture each pipeline class serves (`model.adapter` / model_index.json).
SPEC_KEY = "omni_rl"


def model_config_from_data(data: dict[str, Any]) -> ModelConfig:
    """`ModelConfig` from `dataclasses.asdict` output, nested blocks included (through the schema,
    so an unknown key or a wrong type fails here, naming it)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), data))


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default dtype set to `dtype` for the block, then put back."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class DiffusionPipelineCore:
    """A batch of vLLM-Omni prompts -> one output envelope per request, with our adapter."""

    def __init__(self, model: DiffusionModelBase, max_num_seqs: int):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs}: expected >= 1")
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.weight_version = 0
        self.stats = {"batches": 0, "samples": 0, "weight_buckets": 0}

    @classmethod
    def from_spec(cls, spec: dict[str, Any], device: torch.device) -> "DiffusionPipelineCore":
        """Build the adapter as the trainer builds its own (seeded, then `build_model` under a
        float32 default dtype). `spec["model"]` is `ModelConfig` as plain data (it crossed a
        process boundary as JSON or msgpack): it is rebuilt through the schema, so nested blocks
        (`lora`) are dataclasses again, as `rollout/server/serve.py` rebuilds the run's config."""
        torch.manual_seed(int(spec["seed"]))
        cfg = options_from_data(model_config_from_data(spec["model"]), tuple(spec.get("plugins") or ()))
        with default_dtype(torch.float32):
            model = build_model(cfg, device, tuple(spec.get("plugins") or ()))
        if not isinstance(model, DiffusionModelBase):
            raise TypeError(f"model.adapter={cfg.adapter!r} builds a {type(model).__name__}: the vllm_omni backend "
                            f"samples diffusion models; use rollout.backend=vllm for text models")
        return cls(model, int(spec["max_num_seqs"]))

    def run(self, prompts: Sequence[Any], sampling_params: Sequence[Any]) -> list[dict[str, Any]]:
        """One output envelope per prompt, in order (`prompts[i]` sampled with `sampling_params[i]`)."""
        return [result_to_output(r) for r in self.sample(prompts, sampling_params)]

    def sample(self, prompts: Sequence[Any], sampling_params: Sequence[Any]) -> list[DiffusionResult]:
        requests = [request_from_prompt(p, s) for p, s in zip(prompts, sampling_params, strict=True)]
        results = sample_requests(self.model, requests, self.max_num_seqs, self.weight_version)
        self.stats["batches"] += 1
        self.stats["samples"] += len(results)
        return results

    @torch.no_grad()
    def load_trainer_tensors(self, tensors: dict[str, torch.Tensor], kind: str) -> int:
        """Load one bucket of the trainer's trainable tensors (LoRA or full); returns how many."""
        check_weight_kind(kind)
        lora = self.model.cfg.lora.enabled
        if (kind == "lora") != lora:
            raise ValueError(f"update_weights(kind={kind!r}) but this pipeline's model has model.lora.enabled={lora}; "
                             f"the trainer and the rollout must share model.lora.enabled")
        self.model.load_named_tensors(tensors)
        self.stats["weight_buckets"] += 1
        return len(tensors)


class OmniRLDiffusionPipeline(nn.Module):
    """The vLLM-Omni side: a custom pipeline around `DiffusionPipelineCore` (see the module docstring)."""

    supports_request_batch: ClassVar[bool] = True
    architecture: ClassVar[str] = ""

    def __init__(self, *, od_config: Any, prefix: str = ""):
        super().__init__()
        spec = (getattr(od_config, "custom_pipeline_args", None) or {}).get(SPEC_KEY)
        if spec is None:
            raise ValueError(f"{type(self).__name__} needs custom_pipeline_args[{SPEC_KEY!r}] (the run's model "
                             f"config); start it through omni_rl's vllm_omni rollout backend")
        self.od_config = od_config
        self.weights_sources: list = []  # the adapter loads its own weights
        # On the CPU: vLLM-Omni moves the pipeline itself (docs/rollout.md says why).
        self.core = DiffusionPipelineCore.from_spec(dict(spec), torch.device("cpu"))
        architecture = type(self.core.model).__name__
        # Register the adapter's networks, so vLLM-Omni's `.to()`, `.eval()` and memory
        # accounting see them.
        parts = dict(self.core.model.trainable_modules())
        parts.update({f"frozen_{i}": m for i, m in enumerate(self.core.model.frozen_modules())})
        self.components = nn.ModuleDict(parts)
        self._check_architecture(spec, architecture)

    def _apply(self, fn, recurse: bool = True):
        """After vLLM-Omni's `.to(device)` the adapter computes where its networks now are."""
        moved = super()._apply(fn, recurse)
        devices = {t.device for t in itertools.chain(self.components.parameters(), self.components.buffers())}
        if len(devices) != 1:
            raise RuntimeError(f"{type(self).__name__}: after a move the adapter's networks sit on {sorted(map(str, devices))}, "
                               f"expected one device")
        self.core.model.device = devices.pop()
        return moved

    def _check_architecture(self, spec: dict, built: str) -> None:
        wanted = spec.get("architecture")
        if self.architecture and wanted and wanted != self.architecture:
            raise ValueError(f"{type(self).__name__} serves {self.architecture} but the run's model is {wanted} "
                             f"({built}); pick the pipeline class of PIPELINE_CLASSES[{wanted!r}]")

    def forward(self, req: Any) -> list:
        from vllm_omni.diffusion.data import DiffusionOutput

        outputs = self.core.run(req.prompts, req.sampling_params_list)
        return [DiffusionOutput(output=out) for out in outputs]

    def load_weights(self, weights) -> Optional[set]:
        for _ in weights:  # none are listed (weights_sources is empty); drain what comes
            pass
        return None  # no strict check: the adapter loaded its weights itself

    def load_trainer_tensors(self, tensors: dict[str, torch.Tensor], kind: str) -> int:
        return self.core.load_trainer_tensors(tensors, kind)


class OmniRLStableDiffusion3Pipeline(OmniRLDiffusionPipeline):
    architecture = "StableDiffusion3Pipeline"


class OmniRLWanPipeline(OmniRLDiffusionPipeline):
    architecture = "WanPipeline"


class OmniRLQwenImagePipeline(OmniRLDiffusionPipeline):
    architecture = "QwenImagePipeline"


PIPELINE_CLASSES = {
    cls.architecture: f"{cls.__module__}.{cls.__qualname__}"
    for cls in (OmniRLStableDiffusion3Pipeline, OmniRLWanPipeline, OmniRLQwenImagePipeline)
}


def pipeline_class_for(architecture: str) -> str:
    """The qualified name of the pipeline class serving `architecture`, or a ValueError listing them."""
    if architecture not in PIPELINE_CLASSES:
        raise ValueError(
            f"model.adapter={architecture!r}: the vllm_omni rollout backend has pipelines for "
            f"{', '.join(sorted(PIPELINE_CLASSES))}; use rollout.backend=native for this model"
        )
    return PIPELINE_CLASSES[architecture]

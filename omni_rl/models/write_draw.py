"""`WriteDrawModelBase`: an image model with a separate prompt-writer language model in front of it.

The writer (any registered `AutoregressiveModelBase`, its own weights, LoRA or full fine-tuning)
reads each request and writes the text the image model is conditioned on (`image_prompt`); the
two are one trajectory of the `write_draw` family, which is the think-draw family's with the plan
written by the second model. An image adapter takes part by one class of its own that puts this
base first (`adapters/sd3_write_draw.py`: `StableDiffusion3Pipeline`, stage `write_draw`).

Each model is an optimizer group of its own (`optimizer_groups`: own learning rate, own gradient
clip). Either model may be frozen (`train_image`, `writer.trained`); a frozen one's parameters
are outside every group.

Not here: a reference policy (KL) for the writer, sharded or Ray training (the family refuses them
at load), the writer's own adapter options (its defaults are used), a key/value cache for the
writer's sampling (each token re-reads the context: the texts are short).
"""
from __future__ import annotations

import math
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from omni_rl.config.schema import LoraConfig, ModelConfig
from omni_rl.errors import OmniConfigError
from omni_rl.models.autoregressive import AutoregressiveModelBase
from omni_rl.models.base import OptimizerGroup
from omni_rl.models.conditioning import Conditioning
from omni_rl.models.factory import build_model
from omni_rl.models.registry import ADAPTERS, adapter_key
from omni_rl.models.think_draw import ThinkDrawModelBase, plan_token
from omni_rl.option import ComponentOptions, option

# The image model's trained parameters' group, and the writer's (`optimizer_groups`, actor/<name>_grad_norm).
IMAGE_GROUP, WRITER_GROUP = "image", "writer"
# The fields `image_prompt` may name.
PROMPT_FIELDS = ("prompt", "written")


@dataclass
class WriterOptions(ComponentOptions):
    """The prompt writer (`model.adapter_options.writer`): which language model, how it trains."""

    adapter: str = option("Qwen3ForCausalLM", "The writer's adapter: a registered language model (an "
                                              "AutoregressiveModelBase, e.g. Qwen3ForCausalLM).")
    stage: Optional[str] = option(None, "The writer adapter's stage, for models with several (null: none).")
    path: str = option("tiny:qwen3", "The writer's weights: a local folder, a hub id or tiny:NAME.")
    dtype: str = option("float32", "The writer's weights' dtype (float32, bfloat16, float16).")
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={
        "doc": "LoRA on the writer (as model.lora; enabled: false fine-tunes every weight).", "infinite": False})
    lr: Optional[float] = option(None, "The writer's learning rate (its own optimizer group); null: optim.lr.")
    trained: bool = option(True, "Train the writer; false freezes it bit for bit (the image model trains alone).")
    max_prompt_tokens: int = option(64, "The writer's context (chat template and request) in tokens, left-padded "
                                        "to this width so a log-prob does not depend on its batch-mates; a longer "
                                        "request is refused.")

    def check(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype={self.dtype!r}: expected float32, bfloat16 or float16")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr={self.lr!r}: expected a finite value > 0, or null for optim.lr")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens={self.max_prompt_tokens!r}: expected >= 1")


@dataclass
class WriteDrawModelOptions(ComponentOptions):
    """What a write-draw adapter adds to its image adapter's options (`model.adapter_options`)."""

    writer: WriterOptions = field(default_factory=WriterOptions, metadata={
        "doc": "The prompt writer: adapter, path, dtype, lora, lr, trained, max_prompt_tokens.", "infinite": False})
    train_image: bool = option(True, "Train the image model (model.lora says how); false freezes it bit for bit "
                                     "and only the writer trains.")
    image_prompt: str = option("{written}", "The text the image model is conditioned on: {written} is the writer's "
                                            "text, {prompt} the request (the rewards always score the request).")

    def check(self) -> None:
        # The writer's block was checked where it was bound (`bind_options`, under its own key).
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(self.image_prompt) if name is not None}
        except ValueError as err:
            raise ValueError(f"image_prompt={self.image_prompt!r}: not a format string ({err})") from None
        if "written" not in names or names - set(PROMPT_FIELDS):
            raise ValueError(f"image_prompt={self.image_prompt!r}: expected a text with {{written}} (the writer's "
                             f"text) and at most {{prompt}} (the request), e.g. '{{written}}'")
        if not self.train_image and not (isinstance(self.writer, WriterOptions) and self.writer.trained):
            raise ValueError("train_image=false with writer.trained=false: nothing trains; set one of them true")


def writer_model_config(writer: WriterOptions) -> ModelConfig:
    """The writer's own model config (its adapter's options at their defaults)."""
    return ModelConfig(adapter=writer.adapter, stage=writer.stage, path=writer.path, dtype=writer.dtype,
                       lora=writer.lora)


def check_writer_adapter(writer: WriterOptions) -> None:
    """`ValueError` when the writer's adapter is not a registered language model."""
    key = adapter_key(writer.adapter, writer.stage)
    if key not in ADAPTERS:
        raise ValueError(f"model.adapter_options.writer.adapter={key!r}: unknown model adapter; registered: "
                         f"{', '.join(ADAPTERS.names())}")
    if not issubclass(ADAPTERS.get(key), AutoregressiveModelBase):
        raise ValueError(f"model.adapter_options.writer.adapter={key!r}: not a language model (family "
                         f"{ADAPTERS.get(key).family}); the writer writes tokens: use a text adapter such as "
                         f"Qwen3ForCausalLM")


class WriteDrawModelBase(ThinkDrawModelBase):
    """Put first in an image adapter's bases; its options class derives from `WriteDrawModelOptions`."""

    family = "write_draw"

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        # The image adapter loads and sets up its own trainable modules first (the writer is not one
        # of them yet), then the writer is built through its own adapter, LoRA or full as it says.
        self.writer: Optional[AutoregressiveModelBase] = None
        super().__init__(cfg, path, device)
        self.writer = build_model(writer_model_config(self.options.writer), device)
        if not self.options.writer.trained:
            self.writer.trainable_module().requires_grad_(False)

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        check_writer_adapter(cfg.model.adapter_options.writer)

    # --- what trains -------------------------------------------------------------------
    @property
    def trains_writer(self) -> bool:
        return self.options.writer.trained

    @property
    def trains_image(self) -> bool:
        return self.options.train_image

    def image_modules(self) -> dict[str, nn.Module]:
        return super().trainable_modules()

    def trainable_modules(self) -> dict[str, nn.Module]:
        modules = dict(self.image_modules()) if self.trains_image else {}
        if self.writer is not None and self.trains_writer:
            modules[WRITER_GROUP] = self.writer.trainable_module()
        return modules

    def frozen_modules(self) -> list[nn.Module]:
        frozen = list(super().frozen_modules())
        if not self.trains_image:
            frozen += list(self.image_modules().values())
        if self.writer is not None and not self.trains_writer:
            frozen.append(self.writer.trainable_module())
        return frozen

    def setup_trained_modules(self) -> None:
        # The image adapter's own setup (LoRA per model.lora) on the image modules alone; a frozen
        # image model gets none, and `frozen_modules` froze it.
        if self.trains_image:
            super().setup_trained_modules()

    def optimizer_groups(self) -> list[OptimizerGroup]:
        groups = []
        if self.trains_image:
            groups.append(OptimizerGroup(IMAGE_GROUP, [p for m in self.image_modules().values()
                                                       for p in m.parameters() if p.requires_grad]))
        if self.trains_writer:
            groups.append(OptimizerGroup(WRITER_GROUP, self.writer.trainable_parameters(), self.options.writer.lr))
        return groups

    def save_trained(self, folder: str) -> None:
        """The image model's export as its adapter writes it (when it trains), the writer's in `folder/writer`."""
        if self.trains_image:
            if self.cfg.lora.enabled:
                self.save_lora(folder)
            else:
                for name, module in self.image_modules().items():
                    module.save_pretrained(f"{folder}/{name}")
        if self.trains_writer:
            self.writer.save_trained(str(Path(folder) / WRITER_GROUP))

    # --- the writer's text ---------------------------------------------------------------
    def writer_context(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The chat-templated requests, left-padded to `writer.max_prompt_tokens`: ([B, P] long, [B, P] long)."""
        width = self.options.writer.max_prompt_tokens
        ids = torch.full((len(prompts), width), self.writer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            row = self.writer.encode_prompt([{"role": "user", "content": prompt}]).input_ids.flatten()
            if row.numel() > width:
                raise OmniConfigError(f"the writer's context of {prompt[:40]!r} is {row.numel()} tokens: expected at most "
                                 f"model.adapter_options.writer.max_prompt_tokens={width}; raise it or shorten the prompt")
            ids[i, width - row.numel():], mask[i, width - row.numel():] = row, 1
        return ids, mask

    @torch.no_grad()
    def sample_plans(self, prompts, seeds, max_new_tokens, temperature):
        context, context_mask = self.writer_context(list(prompts))
        b = len(prompts)
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        ids = torch.zeros(b, max_new_tokens, dtype=torch.long)
        mask = torch.zeros(b, max_new_tokens, dtype=torch.float32)
        done = torch.zeros(b, dtype=torch.bool)
        eos = set(self.writer.eos_token_ids)
        for t in range(max_new_tokens):
            sequence = torch.cat([context, ids[:, :t]], dim=1)
            attention = torch.cat([context_mask, mask[:, :t].long()], dim=1)
            logits, _ = self.writer.forward_logits(sequence, attention, logits_to_keep=1)
            logits = logits[:, -1].float().cpu()
            for i in (~done).nonzero().flatten().tolist():
                token = plan_token(logits[i], temperature, gens[i])
                ids[i, t], mask[i, t] = token, 1.0
                done[i] = token in eos
            if bool(done.all()):
                break
        return ids, mask

    def plan_log_probs(self, prompts, plan_ids, plan_mask, temperature):
        context, context_mask = self.writer_context(list(prompts))
        sequence = torch.cat([context, plan_ids.cpu()], dim=1)
        attention = torch.cat([context_mask, plan_mask.cpu().long()], dim=1)
        return self.writer.token_log_probs(sequence, attention, context.shape[1], temperature)

    def decode_plan(self, ids: list[int]) -> str:
        return self.writer.decode_tokens(ids)

    def image_prompts(self, prompts: list[str], plan_ids: torch.Tensor, plan_mask: torch.Tensor) -> list[str]:
        """What the image model reads for each request: `image_prompt` filled with the writer's text."""
        return [self.options.image_prompt.format(prompt=prompt, written=self.decode_plan(row[m.bool()].tolist()))
                for prompt, row, m in zip(prompts, plan_ids, plan_mask)]

    @torch.no_grad()
    def encode_prompts_with_plans(self, prompts, plan_ids, plan_mask, negative_prompt: str = "") -> Conditioning:
        return self.encode_prompts(self.image_prompts(list(prompts), plan_ids, plan_mask), negative_prompt)

"""Causal language models (`Qwen3ForCausalLM` and others loadable with `AutoModelForCausalLM`).

The text path: the model and its tokenizer load with transformers' `from_pretrained` from a local
folder or a hub snapshot; prompts go through the tokenizer's chat template; LoRA (PEFT) sits on
the attention projections; the reference policy is the base model with LoRA disabled.

transformers is imported inside the methods, so registering the adapter stays cheap.

Its tiny models are in `adapters/tiny/qwen3.py`,
its view for the planner in `adapters/plan/qwen3.py`.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from omni_rl.config.schema import ModelConfig
from omni_rl.models import register_adapter
from omni_rl.models.autoregressive import AutoregressiveModelBase, PromptInputs


class CausalLMAdapter(AutoregressiveModelBase):
    default_lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    takes_tools = True  # the tokenizer's chat template takes `tools=` (Qwen3's shows them in a system turn)

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        super().__init__(cfg, path, device)
        self.model = self.load_pretrained(AutoModelForCausalLM).to(device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.chat_template is None:
            raise ValueError(
                f"the tokenizer at {path!r} has no chat template; use an instruct/chat checkpoint "
                f"or set one on the tokenizer and save it"
            )
        self.setup_trainable()

    def trainable_module(self):
        return self.model

    def fsdp_wrap_classes(self):
        layers = self.checkpointed_layers()  # the decoder layers, found through a PEFT wrapper too
        return (type(layers[0]),) if layers else ()

    def encode_prompt(self, messages: list[dict[str, Any]], media: Optional[dict[str, Any]] = None) -> PromptInputs:
        if media:
            raise ValueError(
                f"{type(self).__name__} is a text model but the prompt has media ({sorted(media)}); "
                f"use an omni adapter (e.g. Qwen3OmniMoeForConditionalGeneration) for images and audio"
            )
        ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # transformers >= 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return PromptInputs(input_ids=torch.tensor(ids, dtype=torch.long))

    def chat_text(self, messages: list[dict[str, Any]], tools: Optional[list[dict]] = None,
                  add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False)

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM", "AutoModelForCausalLM")
for _architecture in ARCHITECTURES:
    register_adapter(_architecture)(CausalLMAdapter)

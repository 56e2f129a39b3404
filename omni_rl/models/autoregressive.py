"""`AutoregressiveModelBase`: the contract of text and omni-modal language models.

An action is a token; rollout and trainer compute
log_prob(token_t) = log_softmax(logits_{t-1} / temperature)[token_t] (fp32) with the same method.
Subclasses give `encode_prompt`, `forward_logits` (left-padded batches; positions come from the
attention mask), `token_log_probs`, `strip_for_training`, `context_length`, and for a MoE model
`router_modules` (`omni_rl.models.moe_routing` hooks them).
"""
from __future__ import annotations

import contextlib
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Optional

import torch

from omni_rl.models.base import OmniModelBase
from omni_rl.models.moe_routing import RouterHooks


# Context lengths above this are placeholders for "no limit", not limits.
MAX_SANE_CONTEXT = 100_000_000


@dataclass
class PromptInputs:
    """One prompt, tokenised: ids [P] (long) and the processor's media tensors (batch of 1)."""

    input_ids: torch.Tensor
    media: dict[str, torch.Tensor] = field(default_factory=dict)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count only attended tokens: left padding does not shift positions."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class AutoregressiveModelBase(OmniModelBase):
    family: ClassVar[str] = "autoregressive"
    # Incremental decoding with the model's key/value cache; adapters whose forward cannot take a
    # cache (or whose positions need more than the mask) set False and the engine recomputes
    # the prefix each token instead.
    supports_kv_cache: ClassVar[bool] = True
    # Whether `chat_text` renders tool schemas and tool turns through the chat template and
    # `encode_text` tokenises its text: what an agent run (`agent:` in the config) needs.
    takes_tools: ClassVar[bool] = False
    # Whether the model reads images inside a conversation: `encode_media_text` turns template text
    # whose image parts the chat template rendered into token ids with the images' placeholder
    # runs and the processor's tensors, and `forward_logits` takes those tensors with a chunk of new
    # tokens after a cached prefix. An agent feeds a tool's image (the `draw` tool's) this way.
    takes_images: ClassVar[bool] = False
    tokenizer: Any = None

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.tokenizer.eos_token_id
        return list(ids) if isinstance(ids, (list, tuple)) else [ids]

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.eos_token_ids[0]

    @abstractmethod
    def encode_prompt(self, messages: list[dict[str, Any]], media: Optional[dict[str, Any]] = None) -> PromptInputs:
        """Apply the chat template (generation prompt added) and the processor."""

    def chat_text(self, messages: list[dict[str, Any]], tools: Optional[list[dict]] = None,
                  add_generation_prompt: bool = False) -> str:
        """The chat template's text of `messages` (roles user, assistant with `tool_calls`, tool,
        system), the `tools`' JSON schemas shown as the template shows them; adapters that set
        `takes_tools` give it."""
        raise NotImplementedError(f"{type(self).__name__} does not render tool turns (takes_tools=False)")

    def encode_text(self, text: str) -> list[int]:
        """Token ids of template text (special tokens such as <|im_start|> included as such)."""
        raise NotImplementedError(f"{type(self).__name__} does not encode template text (takes_tools=False)")

    def encode_media_text(self, text: str, images: Optional[list[Any]] = None) -> PromptInputs:
        """Template text with one image placeholder per image of `images` (PIL images, in order)
        -> its token ids (each placeholder expanded to the image's run) and its media tensors, the
        keys `encode_prompt` gives (empty ones included), so any two of them concatenate."""
        raise NotImplementedError(f"{type(self).__name__} reads no images in a conversation (takes_images=False)")

    def image_tokens(self, height: int, width: int) -> int:
        """Tokens one image of `height` x `width` pixels takes in a conversation (its placeholder
        run and its markers), for `--plan`; adapters that set `takes_images` give it."""
        raise NotImplementedError(f"{type(self).__name__} reads no images in a conversation (takes_images=False)")

    def context_length(self) -> Optional[int]:
        """Positions the model attends over, or None when it does not say.

        The config's `max_position_embeddings` wins; the tokenizer's `model_max_length` is the fallback,
        unless it is not a whole number in [1, 1e8] (transformers writes 1e30 for no limit).
        """
        config = getattr(self.trainable_module(), "config", None)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        for value in (getattr(text_config, "max_position_embeddings", None),
                      getattr(self.tokenizer, "model_max_length", None)):
            if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_SANE_CONTEXT:
                return value
        return None

    def router_modules(self) -> list[torch.nn.Module]:
        """The routers of a mixture-of-experts model, one per MoE layer in layer order, each
        returning transformers' `(router_logits, weights, indices)`; a dense model has none."""
        return []

    @property
    def routing(self) -> Optional[RouterHooks]:
        """Hooks on `router_modules()` that record and replay routed experts (registered on first
        use, kept for the model's life); None for a dense model."""
        if "_routing_hooks" not in self.__dict__:
            routers = self.router_modules()
            self.__dict__["_routing_hooks"] = RouterHooks(routers) if routers else None
        return self.__dict__["_routing_hooks"]

    def decode_tokens(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def strip_for_training(self) -> None:
        """Remove modules the policy never uses; default: nothing to strip."""

    def forward_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        media: Optional[dict[str, torch.Tensor]] = None,
        cache: Any = None,
        position_ids: Optional[torch.Tensor] = None,
        logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor, Any]:
        """Logits [B, T, V] in fp32 (the last `logits_to_keep` positions only when > 0) and the
        updated cache."""
        module = self.trainable_module()
        if position_ids is None:
            position_ids = positions_from_mask(attention_mask)[:, -input_ids.shape[1]:]
        out = module(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            position_ids=position_ids.to(self.device),
            cache=cache,
            use_cache=cache is not None,
            logits_to_keep=logits_to_keep,  # transformers' causal LMs: 0 keeps every position
            **(media or {}),
        )
        return out.logits.float(), getattr(out, "cache", None)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache()

    def token_log_probs(
        self,
        sequences: torch.Tensor,
        attention_mask: torch.Tensor,
        response_start: int,
        temperature: float,
        media: Optional[dict[str, torch.Tensor]] = None,
    ) -> torch.Tensor:
        """Log-probs [B, T - response_start] of `sequences[:, response_start:]`.

        `sequences` [B, T] are left-padded prompts (all ending at column `response_start`)
        followed by right-padded responses; masked positions give meaningless values that the
        caller masks out."""
        # Only the positions that predict a response token (and the last, dropped): a long
        # prompt's logits are never materialised.
        keep = sequences.shape[1] - response_start + 1
        logits, _ = self.forward_logits(sequences, attention_mask, media, logits_to_keep=keep)
        logits = logits[:, :-1] / temperature
        targets = sequences[:, response_start:].to(logits.device)
        return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    def add_lora(self, module, config):
        """Wrap the model in a `peft.PeftModel` (PEFT's own API); it becomes the trained module."""
        from peft import get_peft_model

        self.model = get_peft_model(module, config)
        return self.model

    @contextlib.contextmanager
    def lora_disabled(self) -> Iterator[None]:
        with self.trainable_module().disable_adapter():
            yield

    def enable_checkpointing(self, module) -> None:
        """transformers' activation checkpointing, non-reentrant. transformers only checkpoints
        layers in training mode, so `set_eval_mode` puts the decoder layers back in training
        mode; that changes nothing else in them when their dropout is 0, which is checked."""
        enable = getattr(module, "activation_checkpointing_enable", None) or module.gradient_checkpointing_enable
        enable({"use_reentrant": False})

    def checkpointed_layers(self) -> list:
        """The decoder layers that checkpointing recomputes (the text model's `layers`)."""
        base = self.trainable_module()
        for attr in ("get_base_model",):  # a PeftModel wraps the transformers model
            if hasattr(base, attr):
                base = getattr(base, attr)()
        inner = getattr(base, "model", base)
        return list(getattr(inner, "layers", []))

    def set_eval_mode(self) -> None:
        super().set_eval_mode()
        if self.cfg.gradient_checkpointing:
            for layer in self.checkpointed_layers():
                dropout = [m.p for m in layer.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
                dropout += [v for k, v in vars(getattr(layer, "self_attn", object())).items()
                            if k in ("attention_dropout", "dropout") and isinstance(v, float) and v > 0]
                if dropout:
                    raise ValueError(
                        f"model.gradient_checkpointing=true needs the decoder layers in training mode, but they "
                        f"have dropout {dropout[0]}; set model.gradient_checkpointing=false or use a config with dropout 0"
                    )
                layer.train()

    def save_full(self, folder: str) -> None:
        """The fine-tuned model with its tokenizer: `from_pretrained(folder)` loads both."""
        self.trainable_module().save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    def save_lora(self, folder: str) -> None:
        """PEFT's format (`adapter_config.json` + `adapter_model.safetensors`): load it back with
        `peft.PeftModel.from_pretrained(base_model, folder)`."""
        self.trainable_module().save_pretrained(folder)

"""The chat format of tool use: reading the model's tool calls and writing the turns it reads.

Calls are Qwen3's (and Hermes') format, the one its chat template teaches in the system turn:
`<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`, any number per turn. A call
that is not that (no closing tag, JSON that does not parse, no name, arguments not an object) is
an error the model reads, never an exception. The turns the model reads between its own (tool
answers, an environment's user turn) are rendered by the model's own chat template: the text the
template puts after an assistant turn, up to and including the next generation prompt, so the
tokens fed during rollout are the ones a re-templated conversation would hold. For a model that
reads images in a conversation (`takes_images`), a tool turn's image parts go through the
template's image placeholder and the processor (`encode_media_text`), as a prompt's image does.
"""
from __future__ import annotations

import json
import re
from typing import Any, Optional

import numpy as np
import torch

from omni_rl.agent.components import ToolCall
from omni_rl.models.autoregressive import PromptInputs
from omni_rl.rollout.text_types import TurnFeed

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_OPEN = "<tool_call>"
# A stand-in assistant turn whose rendering ends where the model's turn ended.
_MARK = "\u00a7"


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """(well-formed calls, one error message per malformed call) of a model turn's text."""
    calls, errors = [], []
    for body in _CALL.findall(text):
        try:
            value = json.loads(body)
        except json.JSONDecodeError as err:
            errors.append(f"error: the tool call is not valid JSON ({err.msg} at character {err.pos}); write "
                          f'<tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>')
            continue
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            errors.append('error: the tool call has no "name"; write {"name": TOOL, "arguments": {...}}')
            continue
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            errors.append(f"error: the arguments of {value['name']!r} must be a JSON object, got {arguments!r:.80}")
            continue
        calls.append(ToolCall(value["name"], arguments))
    unclosed = text.count(_OPEN) - len(_CALL.findall(text))
    if unclosed > 0:
        errors.append("error: a <tool_call> has no closing </tool_call>")
    return calls, errors


def wants_tool(text: str) -> bool:
    """Whether a turn tries to call a tool at all (well-formed or not)."""
    return _OPEN in text


class ChatFormat:
    """Token ids of an agent's prompt and of the turns between its own, from `model`'s template
    (`AutoregressiveModelBase.chat_text` / `encode_text`, adapters with `takes_tools`)."""

    def __init__(self, model, tools: list[dict[str, Any]], system_prompt: Optional[str] = None):
        self.model = model
        self.tools = tools or None
        self.system_prompt = system_prompt
        self.stop_ids = set(model.eos_token_ids)
        self.takes_images = bool(model.takes_images)

    def prompt_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.system_prompt is None or (messages and messages[0].get("role") == "system"):
            return list(messages)
        return [{"role": "system", "content": self.system_prompt}, *messages]

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        text = self.model.chat_text(self.prompt_messages(messages), tools=self.tools, add_generation_prompt=True)
        return self.model.encode_text(text)

    def prompt_inputs(self, messages: list[dict[str, Any]]) -> PromptInputs:
        """The prompt's ids, and for a model that reads images its (empty) media tensors, so that
        images fed later join them key for key."""
        if not self.takes_images:
            return PromptInputs(input_ids=torch.tensor(self.prompt_ids(messages), dtype=torch.long))
        text = self.model.chat_text(self.prompt_messages(messages), tools=self.tools, add_generation_prompt=True)
        return self.model.encode_media_text(text, [])

    def continuation_ids(self, messages: list[dict[str, Any]], turn_closed: bool) -> list[int]:
        """The tokens after a model turn that fed `messages` (tool and user turns) and open the
        next assistant turn. `turn_closed`: the model's turn ended with its stop token (already in
        the context); otherwise the template's end of turn is fed first."""
        return self.continuation(messages, [], turn_closed).ids

    def continuation(self, messages: list[dict[str, Any]], images: list[Any], turn_closed: bool) -> TurnFeed:
        """`continuation_ids`, for messages whose `{"type": "image"}` content parts stand for
        `images` (in order; a model with `takes_images`): the ids with each image's placeholder
        run, and the images' media tensors."""
        head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]
        before = self.model.chat_text(head, add_generation_prompt=False)
        full = self.model.chat_text(head + list(messages), add_generation_prompt=True)
        cut = before.rfind(_MARK) + len(_MARK)
        if not full.startswith(before[:cut]):
            raise ValueError(f"{type(self.model).__name__}'s chat template renders an assistant turn differently "
                             f"when tool turns follow it; the agent loop cannot continue its trajectories")
        media: dict[str, torch.Tensor] = {}
        if images:
            encoded = self.model.encode_media_text(full[cut:], [as_pil(image) for image in images])
            ids, media = encoded.input_ids.tolist(), encoded.media
        else:
            ids = self.model.encode_text(full[cut:])
        if turn_closed:
            if not ids or ids[0] not in self.stop_ids:
                raise ValueError(f"{type(self.model).__name__}'s chat template does not end an assistant turn with "
                                 f"its stop token {sorted(self.stop_ids)} (got {ids[:1]}); the agent loop needs it to")
            ids = ids[1:]
        return TurnFeed(ids, media)


def as_pil(image: Any):
    """A tool's image as the processor takes it: a PIL image, or uint8 [H, W, C] (torch or numpy)."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image
    array = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
        raise ValueError(f"a tool's image has dtype {array.dtype} and shape {tuple(array.shape)}; expected a PIL image "
                         f"or uint8 [H, W, C] with C 1, 3 or 4")
    return Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)

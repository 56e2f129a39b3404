"""`judge`: scores an image the `draw` tool made with a registered reward.

The agent passes the image's id (`img-N`, from `draw`'s answer) and, optionally, the prompt to
judge it against (default: the prompt it was drawn from); the tool answers the score under
`reward` (any image reward: `jpeg_compressibility`, the shape detector's, PickScore, ...). The
reward is built with the tool.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from agent_tools import images
from omni_rl.agent import Observation, Tool, register_tool
from omni_rl.option import ComponentOptions, option


@dataclass
class JudgeOptions(ComponentOptions):
    reward: str = option("jpeg_compressibility", "The registered reward that scores the image.")
    reward_options: dict[str, Any] = option({}, "The reward's options.")

    def check(self) -> None:
        if not self.reward:
            raise ValueError("reward='': expected a registered image reward")


@register_tool("judge")
class Judge(Tool):
    description = "Score an image made by draw, by its id; answers the score (higher is better)."
    parameters = {
        "type": "object",
        "properties": {"image": {"type": "string", "description": "The image's id, e.g. img-1"},
                       "prompt": {"type": "string", "description": "The prompt to judge it against"}},
        "required": ["image"],
    }
    Options = JudgeOptions

    def __init__(self, options: JudgeOptions):
        super().__init__(options)
        self._lock = threading.Lock()
        from omni_rl.reward.registry import build_reward

        self._scorer = build_reward(options.reward, **dict(options.reward_options))

    def __call__(self, arguments: dict) -> Observation:
        found = images.find(arguments["image"])
        if found is None:
            return Observation(text=f"error: no image {arguments['image']!r}; pass the id draw answered (img-N)")
        image, drawn_from = found
        prompt = arguments.get("prompt") or drawn_from
        with self._lock:
            score = float(torch.as_tensor(self._scorer(image[None], [prompt], [{}]), dtype=torch.float32)[0])
        return Observation(text=f"{arguments['image']}: {self.options.reward} {score:.3f}", image=image, score=score)

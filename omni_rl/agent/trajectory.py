"""`Trajectory`: one multi-turn conversation as the agent loop recorded it.

The token view is the rollout result's (`TextResult.response_ids` with `response_mask` 1 on the
model's tokens, 0 on the tool and environment turns fed between them); this is the readable view,
what rewards read (`metadata["trajectory"]`) and what the sample log shows: the conversation as
chat messages, every tool call with its arguments and answer, the environment's per-turn rewards
and the reason the trajectory ended. The images a model that reads images was fed (a tool's) are in
`images`; the messages refer to them by `{"type": "image", "image": "image-K"}` parts (K the index),
and the sample log saves each as a PNG and puts its path there instead.

Finish reasons: `answer` (a model turn without a tool call, the environment, if any, done),
`environment` (the environment said done), `max_turns`, `max_total_tokens`, `length` (a model turn
reached rollout.sampling_options.max_new_tokens without ending).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omni_rl.agent.components import ToolCallRecord

IMAGE_REF = "image-{}"
FINISH_REASONS = ("answer", "environment", "max_turns", "max_total_tokens", "length")


def combine_turn_rewards(rewards: list[float], mode: str, discount: float) -> float:
    """An environment's per-turn rewards as one return: their sum, or sum_t discount^t r_t."""
    if mode == "sum":
        return float(sum(rewards))
    if mode == "discounted":
        return float(sum(discount ** t * r for t, r in enumerate(rewards)))
    raise ValueError(f"agent.turn_reward={mode!r}: expected sum or discounted")


@dataclass
class Trajectory:
    prompt: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    model_turns: int = 0
    finish_reason: Optional[str] = None
    env_return: float = 0.0
    # uint8 [H, W, C] images fed to the model, in order (the `image-K` parts of `messages`).
    images: list[Any] = field(default_factory=list)

    @property
    def answer(self) -> str:
        """The text of the last model turn."""
        for message in reversed(self.messages):
            if message["role"] == "assistant":
                return message["content"]
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages, "tool_calls": [c.to_dict() for c in self.tool_calls],
            "turn_rewards": self.turn_rewards, "model_turns": self.model_turns, "finish_reason": self.finish_reason,
            "env_return": self.env_return, "images_fed": len(self.images),
        }

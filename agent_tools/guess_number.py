"""`guess_number`: an environment that holds a secret number and answers each guess.

The example of an environment with state across turns and a reward per turn: the secret is drawn
from the prompt's `metadata["secret"]`, or from a hash of the prompt (so a run repeats); after
each model turn the environment reads the last integer in it and answers "higher", "lower" or
"correct". Each wrong guess scores `step_penalty`, the right one 1 and ends the trajectory; a
turn without a number is told so. Combine the per-turn rewards with `agent.turn_reward` and score
them with the `trajectory_return` reward.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from omni_rl.agent import EnvStep, Environment, Turn, register_environment
from omni_rl.option import ComponentOptions, option

_INTEGER = re.compile(r"-?\d+")


@dataclass
class GuessNumberOptions(ComponentOptions):
    low: int = option(1, "The smallest secret.")
    high: int = option(100, "The largest secret.")
    step_penalty: float = option(-0.1, "The reward of a wrong guess (or of a turn without one).")

    def check(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low={self.low}, high={self.high}: expected low <= high")


@register_environment("guess_number")
class GuessNumber(Environment):
    Options = GuessNumberOptions

    def __init__(self, options: GuessNumberOptions, prompt: str, metadata: dict):
        super().__init__(options, prompt, metadata)
        span = options.high - options.low + 1
        if "secret" in metadata:
            self.secret = int(metadata["secret"])
        else:
            self.secret = options.low + int(hashlib.sha256(prompt.encode()).hexdigest(), 16) % span

    def step(self, turn: Turn) -> EnvStep:
        numbers = _INTEGER.findall(turn.text)
        if not numbers:
            return EnvStep(f"Guess a whole number from {self.options.low} to {self.options.high}.",
                           self.options.step_penalty)
        guess = int(numbers[-1])
        if guess == self.secret:
            return EnvStep("correct", 1.0, done=True)
        return EnvStep("higher" if guess < self.secret else "lower", self.options.step_penalty)

"""`draw`: a frozen diffusion model of the project draws an image from the prompt the agent writes.

Any adapter: the tool builds the model, its family and the native engine from a diffusion recipe
(`recipe` and `overrides`, as the evaluation job does) when it is built (the run's start), and samples with the
ODE (noise 0) from `seed` plus a counter, so a call's image depends on the run and the call's
order only. The model is frozen: it is never trained or synced. The image is kept (`images.keep`)
and its id is in the observation; with `reward` set, the model reads the image's score under that
registered reward. The `Observation` carries the image itself: an omni model (an adapter that
`takes_images`) sees it in the tool turn as an image input (`omni_rl.agent.loop`); a text model
reads the id and the score only.

`drawn_score` is a reward of the agent's trajectory: the score the draw tool gave the last image
the trajectory drew (0 when it drew none, or the tool has no `reward`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch

from agent_tools import images
from omni_rl.agent import Observation, Tool, register_tool
from omni_rl.reward import register_reward
from omni_rl.option import ComponentOptions, option


@dataclass
class DrawOptions(ComponentOptions):
    recipe: str = option("tiny_sd3_flowgrpo", "A diffusion recipe: its model, size and steps draw (the model frozen).")
    overrides: list[str] = option([], "Overrides of that recipe, e.g. [model.path=tiny:sd3_shapes, rollout.sampling_options.num_steps=4].")
    reward: Optional[str] = option(None, "A registered reward whose score of the image the model reads (a text "
                                         "model cannot see the image); null: the image's id only.")
    reward_options: dict[str, Any] = option({}, "The reward's options.")
    seed: int = option(0, "The first call's seed; each later call adds one.")
    device: str = option("cpu", "Where the frozen model runs: cpu, cuda[:N], npu[:N] or auto.")

    def check(self) -> None:
        if not self.recipe:
            raise ValueError("recipe='': expected the name of a diffusion recipe (e.g. tiny_sd3_flowgrpo)")


class FrozenDrawer:
    """A diffusion model, family and engine built from a recipe; `draw(prompt, seed)` -> uint8 [H, W, C]."""

    def __init__(self, recipe: str, overrides: list[str], device: str):
        from omni_rl.compose import load_config
        from omni_rl.device import pick_device
        from omni_rl.families.base import build_family
        from omni_rl.models.factory import build_model
        from omni_rl.rollout.backends import build_rollout_engine

        self.cfg = load_config([f"recipe={recipe}", "model.lora.enabled=false", *overrides])
        self.model = build_model(self.cfg.model, pick_device(device), tuple(self.cfg.plugins))
        self.family = build_family(self.cfg, self.model, trains=False)
        self.engine = build_rollout_engine(self.cfg, self.model)

    def draw(self, prompt: str, seed: int) -> torch.Tensor:
        from omni_rl.data.prompts import PromptItem

        request = self.family.request(PromptItem(prompt, {}), seed, kernel="ode", noise_level=0.0, sde_window_size=0,
                                      sde_window_range=None)
        [result] = self.engine.generate([request], timeout_s=self.cfg.rollout.timeout_s)
        return result.image


@register_tool("draw")
class Draw(Tool):
    description = "Draw an image of a text prompt with the image model; answers the image's id (and its score)."
    parameters = {
        "type": "object",
        "properties": {"prompt": {"type": "string", "description": "What the image shows"}},
        "required": ["prompt"],
    }
    Options = DrawOptions

    def __init__(self, options: DrawOptions):
        super().__init__(options)
        self._lock = threading.Lock()  # one drawing at a time: the engine is synchronous
        # Built with the tool (when the run starts), not in its first call, which the runner's
        # timeout would cut off while the model loads.
        self._drawer = FrozenDrawer(options.recipe, list(options.overrides), options.device)
        self._scorer = None
        if options.reward is not None:
            from omni_rl.reward.registry import build_reward

            self._scorer = build_reward(options.reward, **dict(options.reward_options))
        self._calls = 0

    @classmethod
    def image_size(cls, options: DrawOptions) -> tuple[int, int]:
        from omni_rl.compose import load_config

        cfg = load_config([f"recipe={options.recipe}", *options.overrides])
        return int(cfg.rollout.sampling_options.height), int(cfg.rollout.sampling_options.width)

    def __call__(self, arguments: dict) -> Observation:
        prompt = arguments["prompt"]
        with self._lock:
            seed = self.options.seed + self._calls
            self._calls += 1
            image = self._drawer.draw(prompt, seed)
            score = None
            if self._scorer is not None:
                score = float(torch.as_tensor(self._scorer(image[None], [prompt], [{}]), dtype=torch.float32)[0])
        key = images.keep(image, prompt)
        text = f"{key}: drawn" + (f"; {self.options.reward} score {score:.3f}" if score is not None else "")
        return Observation(text=text, image=image, score=score)


class DrawnScore:
    def __call__(self, samples, prompts, metadata) -> list[float]:
        out = []
        for i, meta in enumerate(metadata):
            if "trajectory" not in meta:
                raise ValueError(f"drawn_score: sample {i} has no metadata['trajectory']; it scores agent trajectories "
                                 f"(algo.family_options.agent_options with the draw tool)")
            scores = [c["score"] for c in meta["trajectory"]["tool_calls"]
                      if c["ok"] and c["name"] == "draw" and c.get("score") is not None]
            out.append(float(scores[-1]) if scores else 0.0)
        return out


@register_reward("drawn_score", modalities=("text",))
def drawn_score() -> DrawnScore:
    return DrawnScore()

"""The agent family: the text family with multi-turn trajectories (`algo.family_options.agent_options`).

The autoregressive family's variant when its agent options name tools or an environment
(`TextFamily.variant`). Its rollout runs the agent loop (`omni_rl.agent.loop`) on an engine
that samples multi-turn; everything after the rollout is the text family's own: a trajectory is
one sample whose response is every turn after the prompt, and its `response_mask` is 0 on the
tool and environment turns, so the token loss, the advantage's tokens, the behaviour policy's
checks and the rollout-vs-trainer gap see the model's tokens only.

Rewards score the last model turn (the answer) and read the whole trajectory in
`metadata["trajectory"]` (`Trajectory.to_dict`: messages, tool calls, per-turn rewards and their
return, the finish reason). The sample logs (`samples/val_step_*.jsonl`, and
`samples/agent_step_*.jsonl` every trainer.val_every training steps) hold whole conversations.

An omni model (an adapter that `takes_images`) sees a tool's image (the `draw` tool's) in the tool
turn: its placeholder tokens are fed tokens, its processor tensors join the sample's media
(`TextBatch.media`: the prompt's, then the trajectory's images), so the trainer's forward of the
whole trajectory sees the same images at the same positions as the rollout did. The sample logs
save each fed image as a PNG beside the log and show its path in the conversation.
"""
from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import Future
from pathlib import Path

import torch

from omni_rl.agent.chat import ChatFormat
from omni_rl.agent.components import ENVIRONMENTS, TOOLS, Tool
from omni_rl.agent.loop import run_trajectories
from omni_rl.agent.trajectory import FINISH_REASONS, IMAGE_REF, Trajectory
from omni_rl.agent.options import AgentOptions
from omni_rl.data.prompts import PromptItem
from omni_rl.data.text_batch import TextBatch
from omni_rl.families.autoregressive import TextFamily, agent_options_of, messages_of
from omni_rl.families.base import register_family
from omni_rl.models.autoregressive import PromptInputs
from omni_rl.utils.atomic import atomic_write_text
from omni_rl.utils.seeding import derive_seed


def build_tools(agent: AgentOptions) -> dict[str, Tool]:
    """The configured tools, each built from its options (bound at load)."""
    return {item["name"]: TOOLS.get(item["name"])(item["tool_options"]) for item in agent.tools}


@register_family("agent")
class AgentFamily(TextFamily):
    def __init__(self, cfg, model, options=None, trains: bool = True):
        super().__init__(cfg, model, options, trains)
        self.agent = agent_options_of(self.options)
        if self.agent is None:
            raise ValueError("the agent family needs algo.family_options.agent_options with tools or an environment, "
                             "bound at load (omni_rl.compose)")
        # The tools are built on the first rollout: a family that only trains (a Ray rank) never
        # loads what they need (the draw tool's diffusion model).
        self._tools: dict[str, Tool] | None = None
        self.chat = ChatFormat(model, [TOOLS.get(item["name"]).schema() for item in self.agent.tools],
                               self.agent.system_prompt)

    def response_budget(self) -> tuple[int, str]:
        # Prompt and trajectory share the model's positions: every turn after the prompt counts.
        return self.agent.max_total_tokens, "algo.family_options.agent_options.max_total_tokens"

    @property
    def tools(self) -> dict[str, Tool]:
        if self._tools is None:
            self._tools = build_tools(self.agent)
        return self._tools

    def _encode_uncached(self, item: PromptItem) -> PromptInputs:
        if item.media:
            raise ValueError(f"prompt {item.prompt[:40]!r} has media; an agent's prompts are text in this version")
        return self.chat.prompt_inputs(messages_of(item))

    def _environment(self):
        a = self.agent
        if a.environment is None:
            return None
        cls, options = ENVIRONMENTS.get(a.environment), a.environment_options
        return lambda prompt, metadata: cls(options, prompt, metadata)

    def trajectories(self, engine, requests, items: list[PromptItem]) -> tuple[list, list[Trajectory]]:
        return run_trajectories(engine, requests, [i.prompt for i in items], [i.metadata for i in items],
                                self.agent, self.tools, self.chat, self.model.decode_tokens, self._environment())

    def rollout(self, engine, prompts: list[PromptItem], step: int, score=None) -> tuple[TextBatch, list]:
        n = self.cfg.trainer.samples_per_prompt
        requests, items, groups = [], [], []
        for g, item in enumerate(prompts):
            for k in range(n):
                requests.append(self.request(item, derive_seed(self.cfg.trainer.seed, "train", step, g * n + k)))
                items.append(item)
                groups.append(g)
        results, trajectories = self.trajectories(engine, requests, items)
        metadata = [dict(item.metadata, trajectory=t.to_dict()) for item, t in zip(items, trajectories)]
        batch = TextBatch.from_results(results, [i.prompt for i in items], metadata, groups, self.model.pad_token_id)
        batch.texts = [t.answer for t in trajectories]
        batch.finish_reasons = [t.finish_reason for t in trajectories]
        batch.extras["agent"] = {**trajectory_metrics(trajectories, batch), **prefix_cache_metrics(results)}
        every = self.cfg.trainer.val_every
        if every and step % every == 0:
            write_conversations(Path(self.cfg.trainer.output_dir) / "samples" / f"agent_step_{step:06d}.jsonl",
                                trajectories)
        reward_futures: list[Future] = []
        if score is not None:  # the engine is synchronous: every trajectory is done here
            for text, item, meta in zip(batch.texts, items, batch.metadata):
                reward_futures.append(Future())
                score(text, item.prompt, meta, reward_futures[-1])
        return batch, reward_futures

    def rollout_metrics(self, batch: TextBatch) -> dict[str, float]:
        metrics = super().rollout_metrics(batch)
        metrics.update(batch.extras.get("agent", {}))
        return metrics

    @torch.no_grad()
    def validate(self, engine, items: list[PromptItem], step: int, rewards, output_dir: Path, logger) -> dict[str, float]:
        requests, shown = self.validation_requests(items)
        if not requests:
            return {}
        results, trajectories = self.trajectories(engine, requests, shown)
        metadata = [dict(i.metadata, trajectory=tr.to_dict()) for i, tr in zip(shown, trajectories)]
        reward = rewards.score([tr.answer for tr in trajectories], [i.prompt for i in shown], metadata)
        write_conversations(output_dir / "samples" / f"val_step_{step:06d}.jsonl", trajectories, reward.total.tolist())
        metrics = {f"val/{k}": v for k, v in reward.metrics.items()}
        metrics["val/agent/tool_call_rate"] = sum(any(c.ok for c in tr.tool_calls) for tr in trajectories) / len(trajectories)
        return metrics


def trajectory_metrics(trajectories: list[Trajectory], batch: TextBatch) -> dict[str, float]:
    """`agent/*`: turns, tool use and its failures, where trajectories ended, and the token split."""
    n = len(trajectories)
    calls = [c for t in trajectories for c in t.tool_calls]
    reasons = Counter(t.finish_reason for t in trajectories)
    response = batch.attention_mask[:, batch.prompt_width:].float()
    model_tokens = batch.response_mask.sum(1)
    metrics = {
        "agent/turns_mean": sum(t.model_turns for t in trajectories) / n,
        "agent/tool_calls_mean": len(calls) / n,
        # Trajectories with at least one answered call: what "learns to call the tool" moves.
        "agent/tool_call_rate": sum(any(c.ok for c in t.tool_calls) for t in trajectories) / n,
        "agent/tool_error_rate": (sum(not c.ok for c in calls) / len(calls)) if calls else 0.0,
        "agent/model_tokens_mean": float(model_tokens.mean()),
        "agent/fed_tokens_mean": float((response.sum(1) - model_tokens).mean()),
        "agent/return_mean": sum(t.env_return for t in trajectories) / n,
    }
    for reason in FINISH_REASONS:
        metrics[f"agent/finish/{reason}"] = reasons.get(reason, 0) / n
    return metrics


def prefix_cache_metrics(results: list) -> dict[str, float]:
    """`agent/prefix_cache_hit`: the share of the continued turns' prompt tokens that the engine's
    prefix cache served (vLLM's multi-turn results count them in `extras`); none from an engine
    that keeps each trajectory's KV itself (native: nothing is encoded twice)."""
    counted = [r.extras for r in results if r.extras and "continued_prompt_tokens" in r.extras]
    prompt = sum(e["continued_prompt_tokens"] for e in counted)
    if not prompt:
        return {}
    return {"agent/prefix_cache_hit": sum(e["prefix_cached_tokens"] for e in counted) / prompt}


def write_conversations(path: Path, trajectories: list[Trajectory], rewards: list[float] | None = None) -> None:
    """One JSON line per trajectory: the prompt, the whole conversation, its tool calls, why it
    ended. The images a trajectory was fed are saved as PNGs in a folder named after the log
    (`agent_step_000010/3_image-0.png`: trajectory 3's first image), and each image part of the
    conversation holds that path, relative to the log's folder, instead of the image."""
    lines = []
    for i, t in enumerate(trajectories):
        row = {"prompt": t.prompt, **t.to_dict()}
        if t.images:
            row["messages"] = _with_image_paths(t, i, path)
        if rewards is not None:
            row["reward"] = rewards[i]
        lines.append(json.dumps(row, ensure_ascii=False, default=str))
    atomic_write_text(path, "\n".join(lines) + "\n")


def _with_image_paths(t: Trajectory, index: int, log: Path) -> list[dict]:
    """`t.messages` with each `image-K` reference replaced by the path of its saved PNG."""
    from PIL import Image

    from omni_rl.agent.chat import as_pil

    folder = log.parent / log.stem
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for k, image in enumerate(t.images):
        ref = IMAGE_REF.format(k)
        file = folder / f"{index}_{ref}.png"
        picture: Image.Image = as_pil(image)
        picture.save(file)
        paths[ref] = str(file.relative_to(log.parent))
    messages = []
    for m in t.messages:
        if isinstance(m.get("content"), list):
            m = dict(m, content=[dict(p, image=paths.get(p.get("image"), p.get("image"))) if p.get("type") == "image"
                                 else p for p in m["content"]])
        messages.append(m)
    return messages

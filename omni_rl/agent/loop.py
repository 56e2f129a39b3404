"""The agent loop: a model turn, its tool calls answered, the environment's word, the next turn.

`run_trajectories` hands a step's requests (one per trajectory) to a rollout engine that samples
multi-turn (`generate_turns`, declared by its backend's `multi_turn`), with a `Session` per
trajectory that decides what follows each model turn:

1. the turn's text is parsed for tool calls (`chat.parse_tool_calls`); malformed ones and calls
   to unknown tools become error observations;
2. the calls run through the `ToolRunner` (own thread, timeout, output cap);
3. the environment, if any, steps on the turn (its reward for the turn, a user turn, done);
4. the trajectory ends on an answer without a tool call, on the environment's done, or at a
   limit (`max_turns`, `max_total_tokens`, a turn cut at max_new_tokens), keeping
   what it has; otherwise the answers are rendered by the chat template and fed to the engine.

Sessions step in a small thread pool, so the engine keeps decoding the other trajectories while
one waits on its tools. Not here: how the engine batches (`rollout/text_turns.py`), what the
rewards make of a trajectory (they read `Trajectory`).
"""
from __future__ import annotations

import logging
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

from omni_rl.agent.chat import ChatFormat, parse_tool_calls
from omni_rl.agent.components import Environment, Tool, ToolCallRecord, Turn
from omni_rl.agent.runner import ToolRunner
from omni_rl.agent.trajectory import IMAGE_REF, Trajectory, combine_turn_rewards
from omni_rl.agent.options import AgentOptions
from omni_rl.rollout.text_types import TurnFeed

log = logging.getLogger(__name__)


class Session:
    """One trajectory's side of the loop: its environment, its record, its limits."""

    def __init__(self, trajectory: Trajectory, decode: Callable[[list[int]], str], runner: ToolRunner,
                 chat: ChatFormat, agent: AgentOptions, environment: Optional[Environment]):
        self.trajectory = trajectory
        self.decode = decode
        self.runner = runner
        self.chat = chat
        self.agent = agent
        self.environment = environment

    def step(self, turn_ids: list[int], reason: str, room: int) -> Optional[list[int] | TurnFeed]:
        """What the model reads after this turn (token ids, with the images of its tool turns for
        a model that reads them), or None: the trajectory ends."""
        t = self.trajectory
        closed = reason == "stop"
        text = self.decode(turn_ids[:-1] if closed else turn_ids)
        t.model_turns += 1
        t.messages.append({"role": "assistant", "content": text})
        calls, errors = parse_tool_calls(text)
        records = [ToolCallRecord("", None, message, ok=False, error="malformed") for message in errors]
        records += [self.runner.run(call) for call in calls]
        t.tool_calls.extend(records)
        # A model that reads images sees a tool's image in the tool turn, before the tool's text.
        # (A text model reads the tool's text only; `takes_images` is read only when there is an image.)
        show = any(r.image is not None for r in records) and self.chat.takes_images
        images: list[Any] = []
        fed: list[dict[str, Any]] = []
        for r in records:
            if show and r.image is not None:
                ref = IMAGE_REF.format(len(t.images) + len(images))
                images.append(r.image)
                fed.append({"role": "tool", "content": [{"type": "image", "image": ref},
                                                        {"type": "text", "text": r.observation}]})
            else:
                fed.append({"role": "tool", "content": r.observation})
        env_step = None
        if self.environment is not None:
            env_step = self.environment.step(Turn(t.model_turns - 1, text, records))
            t.turn_rewards.append(float(env_step.reward))
            if env_step.observation is not None:
                fed.append({"role": "user", "content": env_step.observation})
        if reason == "max_total_tokens":
            return self._end("max_total_tokens")
        if env_step is not None and env_step.done:
            return self._end("environment")
        if not fed:
            return self._end("length" if reason == "length" else "answer")
        if t.model_turns >= self.agent.max_turns:
            return self._end("max_turns")
        if images:
            feed = self.chat.continuation(fed, images, turn_closed=closed)
            ids = feed.ids
        else:
            feed = ids = self.chat.continuation_ids(fed, turn_closed=closed)
        if len(ids) >= room:  # and no room for a model token after them
            return self._end("max_total_tokens")
        t.messages.extend(fed)
        t.images.extend(images)
        return feed

    def _end(self, reason: str) -> None:
        t = self.trajectory
        t.finish_reason = reason
        t.env_return = combine_turn_rewards(t.turn_rewards, self.agent.turn_reward, self.agent.discount)
        return None


class AgentHandler:
    """The engine's `TurnHandler`: each ended turn goes to its session in the thread pool."""

    def __init__(self, sessions: dict[int, Session], threads: int):
        self.sessions = sessions
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="agent-session")

    def end_turn(self, request_id: int, turn_ids: list[int], finish_reason: str, room: int) -> Future:
        return self.pool.submit(self.sessions[request_id].step, turn_ids, finish_reason, room)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def run_trajectories(
    engine, requests: Sequence[Any], prompts: Sequence[str], metadata: Sequence[dict], agent: AgentOptions,
    tools: dict[str, Tool], chat: ChatFormat, decode: Callable[[list[int]], str],
    environment: Optional[Callable[[str, dict], Environment]] = None,
) -> tuple[list[Any], list[Trajectory]]:
    """Sample one trajectory per request; (engine results, trajectories), both in request order."""
    runner = ToolRunner(tools, agent.tool_timeout_s, agent.max_tool_output_chars)
    trajectories, sessions = [], {}
    for req, prompt, meta in zip(requests, prompts, metadata):
        trajectory = Trajectory(prompt=prompt, messages=chat.prompt_messages([{"role": "user", "content": prompt}]))
        env = environment(prompt, meta) if environment is not None else None
        sessions[req.request_id] = Session(trajectory, decode, runner, chat, agent, env)
        trajectories.append(trajectory)
    handler = AgentHandler(sessions, agent.tool_threads)
    try:
        results = engine.generate_turns(list(requests), handler, agent.max_total_tokens)
    finally:
        handler.close()
    limited = Counter(t.finish_reason for t in trajectories if t.finish_reason not in ("answer", "environment"))
    if limited:
        log.info("agent: %d of %d trajectories ended at a limit (%s); each is trained on what it has",
                 sum(limited.values()), len(trajectories), ", ".join(f"{k}: {v}" for k, v in sorted(limited.items())))
    return results, trajectories

"""Rollout producers: where a step's batch comes from, one class per `trainer.pipeline`.

The loop asks its producer for each step's batch (`next(step)`), hands it each update's weights
(`publish(version)`), validates through it (`exclusive(fn)`) and checkpoints what it holds
(`state()`), so the loop reads the same in every mode (docs/rollout.md, Pipelines). Each unit of
groups is sampled with one weight version chosen in the loop's thread, so the pipelines are
deterministic, a unit staler than the bound is dropped or rolled again, and a resumed run
samples the very units the uninterrupted one did.

Not here: the rollout itself (the family's), rewards, advantages and old log-probs (the loop).
"""
from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, NamedTuple, Optional

import torch

from omni_rl.config.options import NoOptions
from omni_rl.option import ComponentOptions, option
from omni_rl.config.schema import OmniConfig
from omni_rl.data.prompt_item import PromptItem
from omni_rl.data.prompts import training_prompt_items
from omni_rl.families.base import prompt_limits
from omni_rl.families.offline_pairs import OfflinePairs
from omni_rl.registry import Registry
from omni_rl.rollout.base import RolloutEngineError

# rollout(index) -> (batch, reward futures): the unit made for step `index`, as on_policy makes it.
RolloutFn = Callable[[int], tuple[Any, list]]


@dataclass(frozen=True)
class WeightSnapshot:
    """The trainable tensors of one weight version (detached copies), as `update_weights` takes them."""

    version: int
    kind: str
    tensors: dict[str, torch.Tensor]


class Produced(NamedTuple):
    batch: Any
    reward_futures: list
    metrics: dict[str, float]  # rollout_corr/staleness_mean, _max, dropped_fraction (actor/dpo_pairs: offline pairs)
    # The batch's preferences are given (a `PairBatch` of offline pairs: which image wins is the
    # file's): the loop scores nothing and computes no advantage or old log-prob for it.
    preferences_given: bool = False


class PipelineState(NamedTuple):
    """What a checkpoint keeps of a producer: JSON-able `meta` and the tensors of its versions."""

    meta: dict[str, Any]
    tensors: dict[str, torch.Tensor]


class RolloutProducer(ABC):
    """Built as `cls(cfg, actors, rollout, start_step, saved)`; `saved` is a checkpoint's
    `PipelineState` or None."""

    # The pipeline's options (`trainer.pipeline_options`), bound at config load (`omni_rl.compose`).
    options_class: ClassVar[type] = NoOptions
    # Samples while the trainer updates (one_step_off, async): the rollout engine must be able to
    # (`omni_rl.compose`), and its samples may be stale.
    samples_ahead: ClassVar[bool] = False
    # The `timing/*` name of the loop's wait in `next` (what a step spends getting its batch).
    phase: ClassVar[str] = "rollout"

    def __init__(self, cfg: OmniConfig, actors, rollout: RolloutFn, start_step: int,
                 saved: Optional[PipelineState] = None):
        self.cfg = cfg
        self.options = cfg.trainer.pipeline_options
        self.actors = actors
        self.engine = actors.rollout_engine
        self.rollout = rollout

    @abstractmethod
    def next(self, step: int) -> Produced:
        """Step `step`'s batch: never staler than `trainer.pipeline_options.max_staleness` (see the module doc)."""

    @abstractmethod
    def publish(self, version: int) -> None:
        """The actor's weights are now `version`: the rollouts started from now on use them."""

    def exclusive(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(engine)` with the newest published weights and no unit sampling meanwhile."""
        return fn(self.engine)

    def prompt_items(self) -> list[PromptItem]:
        """The run's training prompts (validation's too, unless the data names its own), before
        the loop fits them to the model: the data's prompts, or the pairs' (offline pairs)."""
        return training_prompt_items(self.cfg.data, prompt_limits(self.cfg))

    def state(self) -> Optional[PipelineState]:
        return None

    def close(self) -> None:
        pass


PIPELINES: Registry[type[RolloutProducer]] = Registry("pipeline")


def register_pipeline(name: str):
    """Class decorator: the `RolloutProducer` that `trainer.pipeline=name` selects."""
    return PIPELINES.register(name)


def staleness_metrics(versions: torch.Tensor, current: int, dropped: int) -> dict[str, float]:
    stale = (current - versions).double()
    return {
        "rollout_corr/staleness_mean": float(stale.mean()),
        "rollout_corr/staleness_max": float(stale.max()),
        "rollout_corr/dropped_fraction": dropped / (dropped + len(versions)),
    }


@register_pipeline("on_policy")
class OnPolicy(RolloutProducer):
    """Each step samples, in the loop's thread, with the weights it then updates."""

    def next(self, step: int) -> Produced:
        batch, futures = self.rollout(step)
        versions = batch.weight_versions
        versions = torch.where(versions < 0, step - 1, versions)  # an engine that does not say
        return Produced(batch, futures, staleness_metrics(versions, step - 1, 0))

    def publish(self, version: int) -> None:
        self.actors.sync_rollout(version)


@register_pipeline("offline_pairs")
class OfflinePairsProducer(RolloutProducer):
    """Offline Diffusion-DPO: step t's batch is the `PairBatch` of its pairs of `data.preference_file`
    (`omni_rl.families.offline_pairs`), read and encoded in the loop's thread. Nothing is sampled,
    so nothing is scored: the batch comes with its preferences given. Which pairs a step trains
    follows from (trainer.seed, step) alone, so the producer keeps no state for a checkpoint."""

    phase = "encode_pairs"

    def __init__(self, cfg: OmniConfig, actors, rollout: RolloutFn, start_step: int,
                 saved: Optional[PipelineState] = None):
        super().__init__(cfg, actors, rollout, start_step, saved)
        self.pairs = OfflinePairs(cfg, actors.model)  # the file read once, here

    def prompt_items(self) -> list[PromptItem]:
        return self.pairs.prompt_items()

    def next(self, step: int) -> Produced:
        pairs = self.pairs.batch(step)
        return Produced(pairs, [], {"actor/dpo_pairs": float(len(pairs))}, preferences_given=True)

    def publish(self, version: int) -> None:
        self.actors.sync_rollout(version)  # validation samples with the trained weights


class _Ticket(NamedTuple):
    index: int                 # the step whose prompts and seeds the unit has
    weights: WeightSnapshot    # the version it is sampled with


class _Unit(NamedTuple):
    ticket: _Ticket
    batch: Any
    reward_futures: list


# The most weight versions a sample may lag the weights it trains (max_staleness). The async
# producer keeps that many steps of rollouts ready or queued (and, past total_steps, the weights
# each would get, for a resumed run): the bound keeps that small, and samples more updates old than this are far
# off-policy (published async RL runs use 1 to 8).
MAX_STALENESS = 64


@dataclass
class StalenessOptions(ComponentOptions):
    """The staleness bound of a pipeline that samples ahead, and what happens beyond it."""

    max_staleness: int = option(1, "The most weight versions a sample may lag the weights it trains (0 = on-policy); checked on every sample before the loss.")
    stale_policy: str = option("drop", "What happens to a group staler than max_staleness: drop (counted, the next ready groups take its place) or reroll (counted, sampled again with the current weights).")

    def check(self) -> None:
        if not self.max_staleness >= 0:
            raise ValueError(f"max_staleness={self.max_staleness!r}: expected an integer >= 0 (weight versions a "
                             f"sample may lag the weights it trains; 0 = on-policy)")
        if self.max_staleness > MAX_STALENESS:
            raise ValueError(f"max_staleness={self.max_staleness!r}: expected at most {MAX_STALENESS} (the async "
                             f"producer keeps that many steps of rollouts ready or queued, and samples that many "
                             f"updates old are far off-policy; runs use 1 to 8)")
        if self.stale_policy not in ("drop", "reroll"):
            raise ValueError(f"stale_policy={self.stale_policy!r}: expected one of drop (leave stale groups out), "
                             f"reroll (sample them again with the current weights)")


@dataclass
class OneStepOffOptions(StalenessOptions):
    def check(self) -> None:
        super().check()
        if self.max_staleness < 1:
            raise ValueError(f"max_staleness={self.max_staleness!r}: expected >= 1 with trainer.pipeline=one_step_off "
                             f"(its samples are one weight version old by construction); use trainer.pipeline=on_policy "
                             f"for fresh samples")


class BufferedProducer(RolloutProducer):
    """Units sampled on a thread of the producer's own, at most `capacity` ahead (module doc)."""

    options_class = StalenessOptions
    samples_ahead = True

    def capacity(self) -> int:
        raise NotImplementedError

    def __init__(self, cfg: OmniConfig, actors, rollout: RolloutFn, start_step: int,
                 saved: Optional[PipelineState] = None):
        super().__init__(cfg, actors, rollout, start_step, saved)
        self.total_steps = cfg.trainer.total_steps
        self.max_staleness, self.stale_policy = self.options.max_staleness, self.options.stale_policy
        self.timeout_s = cfg.rollout.timeout_s
        self.latest = actors.weights_snapshot(start_step)
        self.engine_lock = threading.Lock()  # a unit's sampling, or `exclusive`
        self.cv = threading.Condition()
        self.tickets: deque[_Ticket] = deque()
        # Places freed past total_steps: no unit is made for them, but a run resumed with more
        # steps gives the unit of step `next_index + k` the weights `ahead[k]`, as the
        # uninterrupted run would have (see _fill).
        self.ahead: list[WeightSnapshot] = []
        self.ready: deque[_Unit] = deque()
        self.running: Optional[_Ticket] = None
        self.next_index = start_step + 1
        self.error: Optional[BaseException] = None
        self.closed = False
        for ticket in restore_tickets(saved):  # in step order; sampled again, with the weights they had
            if ticket.index <= self.total_steps:
                self.tickets.append(ticket)
                self.next_index = max(self.next_index, ticket.index + 1)
            else:
                self.ahead.append(ticket.weights)
        self.thread = threading.Thread(target=self._work, name="omni-rl-rollout-producer", daemon=True)
        with self.cv:
            self._fill(demand=False)

    # --- the loop's side -----------------------------------------------------------------
    def next(self, step: int) -> Produced:
        current, dropped = step - 1, 0
        deadline = time.monotonic() + self.timeout_s
        if self.thread.ident is None:
            # Started by the first step, not when built: the loop's prompts (`rollout`) exist by then.
            self.thread.start()
        with self.cv:
            while True:
                while not self.ready:
                    if self.error is not None:
                        raise RolloutEngineError(f"the rollout producer failed: {self.error!r}") from self.error
                    self._fill(demand=True)
                    if time.monotonic() > deadline:
                        raise RolloutEngineError(
                            f"trainer.pipeline={self.cfg.trainer.pipeline}: no rollout of step {step} within "
                            f"rollout.timeout_s={self.timeout_s:g} s; raise it if the model is just slow"
                        )
                    self.cv.wait(0.5)
                unit = self.ready.popleft()
                versions = self._versions(unit)
                if self._within_bound(unit, versions, current):
                    self._fill(demand=False)
                    return Produced(unit.batch, unit.reward_futures, staleness_metrics(versions, current, dropped))
                dropped += len(versions)
                if self.stale_policy == "reroll":
                    self.tickets.appendleft(_Ticket(unit.ticket.index, self.latest))
                    self.cv.notify_all()

    def publish(self, version: int) -> None:
        snapshot = self.actors.weights_snapshot(version)
        with self.cv:
            self.latest = snapshot

    def exclusive(self, fn: Callable[[Any], Any]) -> Any:
        with self.engine_lock:
            with self.cv:
                weights = self.latest
            self._load(weights)
            return fn(self.engine)

    def state(self) -> Optional[PipelineState]:
        with self.cv:
            held = [(u.ticket.index, u.ticket.weights) for u in self.ready] + list(self.tickets)
            held += [(self.running.index, self.running.weights)] if self.running else []
            held += [(self.next_index + k, weights) for k, weights in enumerate(self.ahead)]
        held.sort(key=lambda unit: unit[0])
        tensors = {f"{w.version}/{name}": value for _, w in held for name, value in w.tensors.items()}
        kinds = {str(w.version): w.kind for _, w in held}
        return PipelineState({"units": [[index, w.version] for index, w in held], "kinds": kinds}, tensors)

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        if self.thread.ident is not None:
            self.thread.join(timeout=5)  # a unit still sampling fails once the engine closes

    # --- helpers (called with self.cv held, except on the producer's thread) ------------------
    def _fill(self, demand: bool) -> None:
        """Start units while places are free; with `demand` (the loop waits on an empty buffer),
        one even at capacity 0. The weights are the newest published ones, fixed now."""
        held = len(self.ready) + len(self.tickets) + len(self.ahead) + (self.running is not None)
        while held < self.capacity() or (demand and held == 0):
            if self.next_index <= self.total_steps:
                self.tickets.append(_Ticket(self.next_index, self.latest))
                self.next_index += 1
                self.cv.notify_all()
            else:
                # Past trainer.total_steps no unit is made, not even a ticket: the place only
                # remembers the weights its unit would get, for a run resumed with more steps
                # (`state`), and stays taken so the places fill in the uninterrupted run's order.
                self.ahead.append(self.latest)
            held += 1

    def _versions(self, unit: _Unit) -> torch.Tensor:
        versions = unit.batch.weight_versions
        return torch.where(versions < 0, unit.ticket.weights.version, versions)

    def _within_bound(self, unit: _Unit, versions: torch.Tensor, current: int) -> bool:
        if int((current - versions).max()) > self.max_staleness:
            return False
        groups = unit.batch.group_index
        for g in groups.unique():
            if versions[groups == g].unique().numel() != 1:
                return False  # a group of mixed versions: its advantage would mix them
        return True

    def _load(self, weights: WeightSnapshot) -> None:
        if self.engine.weight_version != weights.version:
            self.engine.update_weights(weights.tensors, weights.version, weights.kind)

    def _work(self) -> None:
        while True:
            with self.cv:
                while not self.closed and not self.tickets:
                    self.cv.wait()
                if self.closed:
                    return
                ticket = self.running = self.tickets.popleft()
            try:
                with self.engine_lock:
                    self._load(ticket.weights)
                    batch, futures = self.rollout(ticket.index)
            except BaseException as err:  # noqa: BLE001 (the loop raises it in next())
                with self.cv:
                    self.error, self.running = err, None
                    self.cv.notify_all()
                return
            with self.cv:
                self.ready.append(_Unit(ticket, batch, futures))
                self.running = None
                self.cv.notify_all()


def restore_tickets(saved: Optional[PipelineState]) -> list[_Ticket]:
    """The units a checkpoint held, each with the weights of its version."""
    if saved is None:
        return []
    tickets = []
    for index, version in saved.meta["units"]:
        prefix = f"{version}/"
        tensors = {k[len(prefix):]: v for k, v in saved.tensors.items() if k.startswith(prefix)}
        tickets.append(_Ticket(int(index), WeightSnapshot(int(version), saved.meta["kinds"][str(version)], tensors)))
    return tickets


@register_pipeline("one_step_off")
class OneStepOff(BufferedProducer):
    """One unit in flight: step t+1's rollout runs while step t updates."""

    options_class = OneStepOffOptions

    def capacity(self) -> int:
        return 1


@register_pipeline("async")
class Async(BufferedProducer):
    """Up to `trainer.pipeline_options.max_staleness` units ready or in flight; each step takes the oldest."""

    def capacity(self) -> int:
        return self.max_staleness

"""Rollout producers (omni_rl/trainer/pipeline.py) on a fake engine: bounds, drops, rerolls, state.

The fake rollout records which weights the engine held; no model runs, each test takes well
under a second (timeouts are sized for a machine many times slower).
"""
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.trainer.pipeline import PIPELINES, PipelineState, WeightSnapshot

GROUPS, PER_GROUP = 2, 3


@dataclass
class FakeBatch:
    weight_versions: torch.Tensor
    group_index: torch.Tensor
    index: int

    def __len__(self):
        return len(self.weight_versions)


@dataclass
class FakeEngine:
    weight_version: int = 0
    loads: list = field(default_factory=list)

    def update_weights(self, tensors, version, kind):
        self.loads.append((version, float(tensors["w"])))
        self.weight_version = version


class FakeActors:
    def __init__(self):
        self.rollout_engine = FakeEngine()
        self.weights = torch.zeros(())

    def weights_snapshot(self, version):
        return WeightSnapshot(version, "full", {"w": self.weights.clone()})


def producer(name, actors, rollout, start_step=0, saved=None, total_steps=None, **options):
    cfg = load_config([f"trainer.pipeline={name}", *[f"trainer.pipeline_options.{k}={v}" for k, v in options.items()],
                       *([f"trainer.total_steps={total_steps}"] if total_steps is not None else [])])
    return PIPELINES.get(name)(cfg, actors, rollout, start_step, saved)


def fake_rollout(actors, delay_s=0.0, mixed=()):
    def rollout(index):
        time.sleep(delay_s)
        v = actors.rollout_engine.weight_version
        versions = torch.full((GROUPS * PER_GROUP,), v)
        if index in mixed:
            versions[0] = v + 1  # the engine swapped weights under one sample of group 0
        return FakeBatch(versions, torch.arange(GROUPS).repeat_interleave(PER_GROUP), index), []

    return rollout


def train(p, actors, steps, start=1, update_s=0.0):
    """The loop's calls: next, a (slow) update, publish. Returns the batches and metrics taken."""
    taken = []
    for step in range(start, start + steps):
        produced = p.next(step)
        taken.append(produced)
        time.sleep(update_s)
        actors.weights = torch.tensor(float(step))  # the update: version `step`'s weights
        p.publish(step)
    return taken


@pytest.mark.parametrize("name, bound", [("one_step_off", 1), ("async", 1), ("async", 2), ("async", 0)])
def test_a_slow_update_never_lets_a_sample_past_the_bound(name, bound):
    actors = FakeActors()
    p = producer(name, actors, fake_rollout(actors), max_staleness=max(bound, 1) if name == "one_step_off" else bound,
                 total_steps=8)
    try:
        taken = train(p, actors, 8, update_s=0.02)
    finally:
        p.close()
    expected = 1 if name == "one_step_off" else bound
    for step, produced in enumerate(taken, start=1):
        assert produced.batch.index == step  # the oldest unit first: the prompts and seeds of its step
        stale = (step - 1) - produced.batch.weight_versions
        assert int(stale.max()) <= expected
        assert int(stale.max()) == min(expected, step - 1)  # deterministic: the versions the bound allows
        assert produced.metrics["rollout_corr/staleness_max"] == float(stale.max())
        assert produced.metrics["rollout_corr/dropped_fraction"] == 0.0
    # Each unit was sampled with the weights of its version, loaded just before.
    for version, value in actors.rollout_engine.loads:
        assert value == float(version)


def test_max_staleness_0_samples_each_step_with_the_weights_it_trains():
    actors = FakeActors()
    calls = []
    rollout = fake_rollout(actors)
    p = producer("async", actors, lambda i: (calls.append(i), rollout(i))[1], max_staleness=0, total_steps=3)
    try:
        time.sleep(0.1)
        assert calls == []  # nothing sampled ahead
        taken = train(p, actors, 3)
    finally:
        p.close()
    assert [int(t.batch.weight_versions.max()) for t in taken] == [0, 1, 2]


def old_unit(index, version):
    """A checkpoint's buffer holding step `index`'s unit sampled with `version`."""
    return PipelineState({"units": [[index, version]], "kinds": {str(version): "full"}},
                         {f"{version}/w": torch.tensor(float(version))})


@pytest.mark.parametrize("policy", ["drop", "reroll"])
def test_a_unit_staler_than_the_bound_is_dropped_or_rerolled_and_counted(policy):
    """A resumed buffer under a lower bound: step 5's unit was sampled with version 2, and the
    bound is 1 at step 5 (version 4 trains)."""
    actors = FakeActors()
    actors.weights = torch.tensor(4.0)
    p = producer("async", actors, fake_rollout(actors), start_step=4, saved=old_unit(5, 2), max_staleness=1,
                 stale_policy=policy, total_steps=8)
    try:
        produced = p.next(5)
    finally:
        p.close()
    assert produced.metrics["rollout_corr/dropped_fraction"] == 0.5  # one unit dropped, one taken
    assert int(produced.batch.weight_versions.max()) == 4
    # drop: the next unit (step 6's prompts) takes its place; reroll: step 5's prompts again.
    assert produced.batch.index == (5 if policy == "reroll" else 6)
    assert (2, 2.0) in actors.rollout_engine.loads  # the saved unit was sampled with its own weights


def test_a_group_of_mixed_versions_never_reaches_the_loss():
    actors = FakeActors()
    p = producer("async", actors, fake_rollout(actors, mixed={2}), max_staleness=2, total_steps=4)
    try:
        taken = train(p, actors, 3)
    finally:
        p.close()
    assert [t.batch.index for t in taken] == [1, 3, 4]
    assert taken[1].metrics["rollout_corr/dropped_fraction"] == 0.5


def test_state_lists_the_units_in_flight_with_their_weights():
    actors = FakeActors()
    p = producer("one_step_off", actors, fake_rollout(actors), total_steps=8)
    try:
        train(p, actors, 3)
        state = p.state()
    finally:
        p.close()
    # After step 3: step 4's unit, sampled with version 2 (published after step 2).
    assert state.meta["units"] == [[4, 2]]
    assert float(state.tensors["2/w"]) == 2.0


def test_a_failed_rollout_fails_next_instead_of_hanging():
    actors = FakeActors()

    def broken(index):
        raise RuntimeError("engine died")

    p = producer("one_step_off", actors, broken, total_steps=4)
    try:
        with pytest.raises(Exception, match="engine died"):
            p.next(1)
    finally:
        p.close()


@pytest.mark.parametrize("overrides, expected", [
    (["trainer.pipeline=async", "trainer.pipeline_options.max_staleness=-1"], "trainer.pipeline_options.max_staleness=-1: expected an integer >= 0"),
    (["trainer.pipeline=one_step_off", "trainer.pipeline_options.max_staleness=0"], "trainer.pipeline_options.max_staleness=0: expected >= 1 with trainer.pipeline=one_step_off"),
    (["trainer.pipeline=async", "trainer.pipeline_options.stale_policy=skip"], "trainer.pipeline_options.stale_policy='skip': expected one of drop"),
    (["trainer.pipeline=offpolicy"], "trainer.pipeline='offpolicy': unknown pipeline; registered: async, offline_pairs, on_policy, one_step_off"),
    (["trainer.pipeline=async", "trainer.backend=ray"], "trainer.pipeline='async': expected on_policy with trainer.backend=ray"),
    (["recipe=tiny_qwen3_grpo", "trainer.pipeline=async", "rollout.backend=vllm"],
     "trainer.pipeline='async': expected on_policy with rollout.backend='vllm', which cannot sample beside the trainer"),
])
def test_bad_pipeline_settings_fail_at_load_naming_the_key(overrides, expected):
    from omni_rl.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    assert str(err.value).startswith(expected), str(err.value)


def test_every_backend_that_can_sample_beside_the_trainer_loads():
    for overrides in (["trainer.pipeline=async"], ["trainer.pipeline=one_step_off", "rollout.backend=server"],
                      ["recipe=tiny_qwen3_grpo", "trainer.pipeline=async", "rollout.backend=vllm",
                       "rollout.backend_options.python=/opt/vllm-omni/bin/python"]):
        assert load_config(overrides).trainer.pipeline in ("async", "one_step_off")


def test_max_staleness_is_bounded_at_load():
    from omni_rl.errors import ConfigError
    from omni_rl.trainer.pipeline import MAX_STALENESS

    load_config(["trainer.pipeline=async", f"trainer.pipeline_options.max_staleness={MAX_STALENESS}"])
    with pytest.raises(ConfigError, match=rf"trainer.pipeline_options.max_staleness=1000000000: expected at most {MAX_STALENESS} "):
        load_config(["trainer.pipeline=async", "trainer.pipeline_options.max_staleness=1000000000"])


def test_async_at_the_bound_samples_nothing_past_total_steps_and_holds_at_most_the_bound():
    from omni_rl.trainer.pipeline import MAX_STALENESS

    actors = FakeActors()
    calls = []
    rollout = fake_rollout(actors)
    p = producer("async", actors, lambda i: (calls.append(i), rollout(i))[1], max_staleness=MAX_STALENESS,
                 total_steps=2)
    try:
        train(p, actors, 2)
        time.sleep(0.1)
        state = p.state()
    finally:
        p.close()
    assert sorted(calls) == [1, 2]
    assert len(state.meta["units"]) <= MAX_STALENESS and all(i > 2 for i, _ in state.meta["units"])


def tickets_made(p):
    """Every step the producer holds a ticket or a unit for, wherever it keeps them (a ticket
    held directly, or in a list or deque, or a unit's ticket)."""
    from omni_rl.trainer.pipeline import _Ticket, _Unit

    found = set()
    for value in vars(p).values():
        for item in value if isinstance(value, (list, deque)) else [value]:
            ticket = item.ticket if isinstance(item, _Unit) else item
            if isinstance(ticket, _Ticket):
                found.add(ticket.index)
    return found


@pytest.mark.parametrize("name, bound", [("one_step_off", 1), ("async", 3)])
def test_no_ticket_or_unit_is_made_past_total_steps_and_a_longer_resume_repeats_the_straight_run(name, bound):
    """N = 4 steps: the producer never holds a ticket or samples a unit for step 5 or later, yet a
    run resumed from step 4 with 8 steps takes, step by step, the units (prompts, seeds and weight
    versions) of a straight 8-step run."""
    def run(total_steps, start=0, saved=None):
        actors, calls = FakeActors(), []
        actors.weights = torch.tensor(float(start))
        rollout = fake_rollout(actors)
        p = producer(name, actors, lambda i: (calls.append(i), rollout(i))[1], start_step=start, saved=saved,
                     max_staleness=bound, total_steps=total_steps)
        seen, taken = set(), []
        try:
            for step in range(start + 1, total_steps + 1):
                taken += train(p, actors, 1, start=step)
                seen |= tickets_made(p)
            time.sleep(0.1)  # the producer's thread, had it work left, would take it now
            seen |= tickets_made(p)
            state = p.state()
        finally:
            p.close()
        return [(t.batch.index, t.batch.weight_versions.tolist()) for t in taken], seen, calls, state, actors

    straight, _, _, _, straight_actors = run(8)
    first, seen, calls, state, _ = run(4)
    assert max(seen) <= 4 and max(calls) <= 4
    # The checkpoint still names the units steps 5.. get in the straight run, with their weights.
    assert [i for i, _ in state.meta["units"]] == list(range(5, 5 + bound))
    resumed, _, _, _, resumed_actors = run(8, start=4, saved=state)
    assert first + resumed == straight
    assert resumed_actors.rollout_engine.loads == straight_actors.rollout_engine.loads[-len(resumed_actors.rollout_engine.loads):]

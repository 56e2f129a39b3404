"""The native diffusion engine with `driver="caller"`: no scheduler thread; the thread that waits
iterates. Results equal the threaded engine's, the forwards run in the waiting thread, several
waiting threads share the iterations, and deadlines and failures keep their rules (checked
between iterations). `rollout.backend_options.driver=auto` picks the caller under on-policy runs.
"""
from __future__ import annotations

import threading

import pytest

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.rollout.backends import build_rollout_engine
from omni_rl.rollout.base import RolloutEngineError
from omni_rl.rollout.native import NativeDiffusionEngine
from tests.omni_rl.rollout.test_native_engine import TIMEOUT_S, SpyModel, assert_same_result, engine_for, request


def test_caller_driver_gives_the_threaded_engines_results_in_the_callers_thread(tiny_sd3):
    reqs = [request(f"prompt {i}", seed=i) for i in range(5)]
    with engine_for(tiny_sd3, max_num_seqs=3) as engine:
        want = engine.generate(reqs, timeout_s=TIMEOUT_S)
        threaded_stats = dict(engine.stats)
    threads_seen: set[int] = set()
    spy = SpyModel(tiny_sd3, lambda i: threads_seen.add(threading.get_ident()))
    before = {t.name for t in threading.enumerate()}
    with engine_for(spy, max_num_seqs=3, driver="caller") as engine:
        assert {t.name for t in threading.enumerate()} == before  # no thread was started
        got = engine.generate(reqs, timeout_s=TIMEOUT_S)
        stats = dict(engine.stats)
    assert threads_seen == {threading.get_ident()}  # every forward ran here
    assert stats == threaded_stats  # the same batches: 3 running, then the rest admitted as room frees
    for a, b in zip(got, want):
        assert_same_result(a, b)


def test_futures_progress_only_while_someone_waits(tiny_sd3):
    with engine_for(tiny_sd3, max_num_seqs=2, driver="caller") as engine:
        reqs = [request(seed=1), request(seed=2)]
        futures = engine.submit_many(reqs)
        assert not any(f.done() for f in futures) and engine.stats["forwards"] == 0
        results = engine.wait(reqs, futures, timeout_s=TIMEOUT_S)
    assert [r.final_latent.shape for r in results] == [tiny_sd3.latent_shape(32, 32)] * 2


def test_two_waiting_threads_share_the_iterations(tiny_sd3):
    first = [request("first", seed=s) for s in (1, 2)]
    second = [request("second", seed=s) for s in (3, 4)]
    with engine_for(tiny_sd3, max_num_seqs=4) as engine:
        want = engine.generate(first + second, timeout_s=TIMEOUT_S)
    got: dict[str, list] = {}
    with engine_for(tiny_sd3, max_num_seqs=4, driver="caller") as engine:
        futures = {"first": engine.submit_many(first), "second": engine.submit_many(second)}
        other = threading.Thread(target=lambda: got.__setitem__(
            "second", engine.wait(second, futures["second"], timeout_s=TIMEOUT_S)))
        other.start()
        got["first"] = engine.wait(first, futures["first"], timeout_s=TIMEOUT_S)
        other.join(TIMEOUT_S)
        assert not other.is_alive()
        assert engine.stats["samples"] == 4
    for a, b in zip(got["first"] + got["second"], want):
        assert_same_result(a, b)


def test_a_failed_forward_fails_every_caller_and_the_engine(tiny_sd3):
    def hook(i):
        if i == 2:
            raise RuntimeError("boom in forward 2")

    with engine_for(SpyModel(tiny_sd3, hook), max_num_seqs=4, driver="caller") as engine:
        other_caller = engine.submit_many([request(seed=s) for s in (7, 8)])
        with pytest.raises(RolloutEngineError, match="boom in forward 2"):
            engine.generate([request(seed=s) for s in range(2)], timeout_s=TIMEOUT_S)
        for future in other_caller:
            with pytest.raises(RuntimeError, match="boom in forward 2"):
                future.result(timeout=1.0)
        assert "boom in forward 2" in engine.failure()
        with pytest.raises(RolloutEngineError, match="boom in forward 2"):
            engine.generate([request()], timeout_s=1.0)


def test_the_deadline_is_checked_between_iterations(tiny_sd3):
    slow = SpyModel(tiny_sd3, lambda i: threading.Event().wait(0.2))  # each forward takes 0.2 s
    with engine_for(slow, max_num_seqs=1, driver="caller") as engine:
        with pytest.raises(RolloutEngineError, match="timed out"):
            engine.generate([request()], timeout_s=0.3)
        assert len(slow.forwards) < 6  # it stopped iterating, short of the sample's 6 steps


def test_an_interrupt_in_the_callers_thread_stays_an_interrupt(tiny_sd3):
    def hook(i):
        raise KeyboardInterrupt

    with engine_for(SpyModel(tiny_sd3, hook), max_num_seqs=1, driver="caller") as engine:
        with pytest.raises(KeyboardInterrupt):
            engine.generate([request()], timeout_s=TIMEOUT_S)


def test_close_fails_what_is_still_queued(tiny_sd3):
    engine = NativeDiffusionEngine(tiny_sd3, max_num_seqs=1, driver="caller")
    futures = engine.submit_many([request()])
    engine.close()
    with pytest.raises(RolloutEngineError, match="closed"):
        futures[0].result(timeout=1.0)
    with pytest.raises(ValueError, match="driver='fiber'"):
        NativeDiffusionEngine(tiny_sd3, driver="fiber")


@pytest.mark.parametrize("driver", ["thread", "caller"])
def test_the_recipe_picks_the_driver(driver, tiny_sd3):
    cfg = load_config(["recipe=tiny_sd3_flowgrpo", f"rollout.backend_options.driver={driver}"])
    engine = build_rollout_engine(cfg, tiny_sd3)
    try:
        assert engine.driver == driver and (engine._thread is not None) == (driver == "thread")
    finally:
        engine.close()


@pytest.mark.parametrize(("pipeline", "driver"), [("on_policy", "caller"), ("one_step_off", "thread"), ("async", "thread")])
def test_auto_picks_the_caller_on_policy_and_the_thread_where_rollouts_overlap_updates(pipeline, driver, tiny_sd3):
    cfg = load_config(["recipe=tiny_sd3_flowgrpo", f"trainer.pipeline={pipeline}"])
    assert cfg.rollout.backend_options.driver == "auto"  # the default
    engine = build_rollout_engine(cfg, tiny_sd3)
    try:
        assert engine.driver == driver and (engine._thread is not None) == (driver == "thread")
    finally:
        engine.close()


def test_a_rollout_servers_engine_keeps_its_own_thread_under_auto():
    from omni_rl.rollout.server.serve import build_server

    server = build_server(load_config(["recipe=tiny_sd3_flowgrpo"]))
    try:
        assert server.engine.driver == "thread" and server.engine._thread is not None
    finally:
        server.server_close()
        server.engine.close()


def test_an_unknown_driver_is_one_error_line(capsys):
    assert main(["--cfg", "rollout.backend_options.driver=fiber"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: rollout.backend_options.driver='fiber': expected auto"), err

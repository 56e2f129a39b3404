"""WorkerGroup on a local Ray: results by rank, a silent worker times out, errors keep their type."""
import os
import time

import pytest

from omni_rl.workers import ResourcePool, WorkerFailedError, WorkerGroup


def group(timeout_s=20.0):
    return WorkerGroup(ResourcePool(1, 2), "cpu", timeout_s)


def test_runs_on_every_rank_and_gathers_in_rank_order(ray_local):
    g = group()
    try:
        def whoami(worker, tag):  # defined here: pickled by value for the workers
            import torch.distributed as dist

            return tag, worker.rank, dist.get_rank(), dist.get_world_size()

        assert g.run("whoami", whoami, [("a",), ("b",)]) == [("a", 0, 0, 2), ("b", 1, 1, 2)]
        assert "rank 1 on" in g.describe()
    finally:
        g.shutdown()


def test_workers_run_at_normal_priority(ray_local):
    """Ray's default niceness (15) would starve the workers beside any busy process."""
    g = group()
    try:
        assert g.run("niceness", lambda worker: os.nice(0)) == [0, 0]
    finally:
        g.shutdown()


def test_a_silent_worker_times_out_naming_it(ray_local):
    g = group(timeout_s=3.0)
    g.step = 7

    def nap(worker, seconds):
        time.sleep(seconds)

    start = time.monotonic()
    with pytest.raises(WorkerFailedError, match=r"rank 1 \(node .*pid \d+\) did not finish nap at step 7") as err:
        g.run("nap", nap, [(0.0,), (60.0,)])
    assert time.monotonic() - start < 15
    assert err.value.rank == 1 and err.value.step == 7
    assert g.closed
    with pytest.raises(WorkerFailedError, match="shut down"):
        g.run("nap", nap, [(0.0,), (0.0,)])


def test_start_up_has_its_own_deadline(ray_local):
    """A call timeout shorter than starting two workers (a process each, torch imported, a gloo
    group) does not bound the start-up, which has trainer.backend_options.worker_startup_timeout_s of its own."""
    g = WorkerGroup(ResourcePool(1, 2), "cpu", 0.05, startup_timeout_s=300.0)
    try:
        assert [info["rank"] for info in g.infos] == [0, 1]
        assert all(isinstance(info["pid"], int) for info in g.infos)  # both workers answered
        assert not g.closed
    finally:
        g.shutdown()


def test_an_error_in_a_program_keeps_its_type(ray_local):
    g = group()

    def fail_on_rank_0(worker):
        if worker.rank == 0:
            raise KeyError("no such tensor")

    with pytest.raises(KeyError, match="no such tensor"):
        g.run("load", fail_on_rank_0)
    assert g.closed  # the peers may be stuck in a collective: the whole group is gone


def test_streamed_calls_come_back_one_by_one(ray_local, tmp_path):
    """Rank 0's second call waits for a file the driver writes only after the first call's result
    has come back: the stream delivers results while later calls are still running (a gather of
    all calls at once would deadlock here and time out)."""
    g = group(timeout_s=20.0)
    gate = tmp_path / "first_result_seen"

    def chunk(worker, name, wait_for):
        if wait_for:
            deadline = time.monotonic() + 15
            while not os.path.exists(wait_for):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{wait_for} never appeared")
                time.sleep(0.01)
        return name, worker.rank

    try:
        refs = g.submit("chunks", chunk, [(0, ("a", None)), (0, ("b", str(gate))), (1, ("c", None))])
        seen = []
        for index, result in g.as_completed(refs, "chunks", ranks=[0, 0, 1]):
            seen.append((index, result))
            if result[0] == "a":
                gate.write_text("ok")
        assert sorted(seen) == [(0, ("a", 0)), (1, ("b", 0)), (2, ("c", 1))]
        assert [r[0] for _, r in seen].index("a") < [r[0] for _, r in seen].index("b")
        with pytest.raises(ValueError, match="ranks \\[2\\] do not exist"):
            g.submit("chunks", chunk, [(2, ("d", None))])
    finally:
        g.shutdown()

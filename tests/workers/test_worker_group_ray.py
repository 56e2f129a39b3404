"""WorkerGroup on a local Ray: results by rank, a silent worker times out, errors keep their type."""
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


def test_an_error_in_a_program_keeps_its_type(ray_local):
    g = group()

    def fail_on_rank_0(worker):
        if worker.rank == 0:
            raise KeyError("no such tensor")

    with pytest.raises(KeyError, match="no such tensor"):
        g.run("load", fail_on_rank_0)
    assert g.closed  # the peers may be stuck in a collective: the whole group is gone

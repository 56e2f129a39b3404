"""`HybridWorker`: one Ray actor per device, one rank of the data-parallel process group.

It joins the torch.distributed group (gloo, NCCL or HCCL, from `omni_rl.device`) and runs the
programs the driver sends (`call(step, fn, *args)`), which install its roles (actor, rollout,
reference) as a `WorkerState` sharing its device. Test hook: `OMNI_RL_FAULT_INJECT="exit:RANK:STEP:PROGRAM"`
makes that rank exit abruptly, as a crashed process would.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

FAULT_ENV = "OMNI_RL_FAULT_INJECT"


def free_port(host: str = "") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class HybridWorker:
    def __init__(self, rank: int, world_size: int, device_name: str, num_threads: int):
        from omni_rl.device import worker_device

        self.rank = rank
        self.world_size = world_size
        torch.set_num_threads(max(1, num_threads))
        self.device = worker_device(device_name)
        self.state: Any = None  # installed by a build program (programs.WorkerState)

    def node_info(self) -> dict[str, Any]:
        import ray

        return {"rank": self.rank, "node": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def master_address(self) -> tuple[str, int]:
        """Rank 0's address and a free port on it: where the process group rendezvous."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def init_process_group(self, addr: str, port: int, timeout_s: float, startup_timeout_s: float) -> None:
        import torch.distributed as dist

        from omni_rl.device import bind_device, dist_backend

        bind_device(self.device)
        # The rendezvous waits for every rank as long as the start-up may take (a rank on a busy
        # machine reaches it seconds after the others); a collective waiting on a dead peer gives
        # up after timeout_s, and the driver notices first.
        store = dist.TCPStore(addr, port, self.world_size, is_master=self.rank == 0,
                              timeout=timedelta(seconds=startup_timeout_s))
        dist.init_process_group(
            backend=dist_backend(self.device), store=store, rank=self.rank, world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )

    def call(self, step: int, fn: Callable[..., Any], *args: Any) -> Any:
        self._maybe_fault(step, fn.__name__)
        return fn(self, *args)

    def _maybe_fault(self, step: int, program: str) -> None:
        spec = os.environ.get(FAULT_ENV)
        if not spec:
            return
        kind, rank, at_step, at_program = spec.split(":")
        if kind == "exit" and int(rank) == self.rank and int(at_step) == step and at_program == program:
            os._exit(17)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

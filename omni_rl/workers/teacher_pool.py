"""Teacher pools on Ray: a teacher with `placement: pool` runs in actors of its own, on devices of
their own, apart from the trainer.

`TeacherPools(cfg)` (the driver, before the actor group) starts `pool_workers` `TeacherWorker`
actors per pooled teacher, each holding one whole frozen copy on one device (a GPU / NPU, or one
CPU on a CPU machine), under the names `families.teachers.pool_actor_name` gives; every training
process (the local trainer, or each Ray rank) finds them by name when it builds its family
(`PooledTeacher`, `PooledTokenTeacher`), sends a micro-batch's stored states there, its rows split
among the actors, and checks what comes back for shape and finiteness like a colocated teacher's.
An actor that dies or does not answer in `pool_timeout_s` stops the run naming the teacher.

`check_device_budget(cfg)` is the load-time check that the devices a run asks for fit the machine.

Left out: teachers of one base sharing a pool (each pooled teacher has its own), sharding a pooled
teacher across its actors (each holds it whole), and counting a cluster's devices at load (with
`ray_address` the placement's own deadline reports a cluster that is too small).
"""
from __future__ import annotations

import math
import os
import socket
from types import SimpleNamespace
from typing import Any

import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.device import DeviceError, device_count, ray_device_resource, worker_device
from omni_rl.families.teachers import (Teacher, build_frozen, check_architecture, freeze, latent_probe,
                                      load_teacher_lora, pool_actor_name, pooled_teachers, teacher_guidance,
                                      teacher_lora_file, teacher_source, teachers_of)
from omni_rl.families.token_teachers import TokenTeacher
from omni_rl.models.diffusion import DiffusionModelBase

KEY = "algo.family_options.teachers"


class TeacherWorker:
    """The Ray actor: one frozen teacher, whole, on this actor's device."""

    def __init__(self, cfg: OmniConfig, index: int, num_threads: int):
        torch.set_num_threads(max(1, num_threads))
        t = teachers_of(cfg.algo.family_options)[index]
        where = f"{KEY}[{index}]"
        device = worker_device(cfg.trainer.device)
        path, revision = teacher_source(cfg, t)
        check_architecture(cfg, path, revision, f"{where}.path")
        model = build_frozen(cfg, path, revision, device)
        if isinstance(model, DiffusionModelBase):
            adapter, adapted = None, ()
            if t.lora is not None:
                file = teacher_lora_file(t.lora, f"{where}.lora")
                adapted, adapter = tuple(load_teacher_lora(model, file, f"{where}.lora", adapter=t.name)), t.name
            self.teacher: Any = Teacher(t, model, teacher_guidance(cfg, t), cfg.rollout.sampling_options.negative_prompt,
                                        shares_student=False, adapter=adapter, adapted=adapted)
        else:
            self.teacher = TokenTeacher(t, model, shares_student=False)
        freeze(model)  # again: a loaded adapter would train otherwise
        self.model = model

    def info(self) -> dict[str, Any]:
        return {"node": socket.gethostname(), "pid": os.getpid()}

    def latent_probe(self, rollout) -> tuple[Any, torch.Tensor]:
        return latent_probe(self.model, rollout)

    def vocab(self) -> dict:
        return self.model.tokenizer.get_vocab()

    def checksum(self) -> str:
        return self.teacher.checksum()

    def velocity(self, latents, sigma: torch.Tensor, prompts: list[str]):
        from omni_rl.algos import latent_streams as ls

        device = self.model.device
        out = self.teacher.velocity(ls.to(latents, device), sigma.to(device), prompts)
        return ls.to(out, "cpu")

    def _on_device(self, sequences, attention_mask, prompt_width, temperature, media):
        """A micro-batch's rows and media on this actor's device, as the teacher reads them."""
        device = self.model.device
        micro = SimpleNamespace(sequences=sequences.to(device), attention_mask=attention_mask.to(device),
                                prompt_width=prompt_width, temperature=temperature)
        return micro, {k: v.to(device) for k, v in media.items()}

    def log_probs(self, sequences, attention_mask, prompt_width: int, temperature: float, media: dict):
        return self.teacher.log_probs(*self._on_device(sequences, attention_mask, prompt_width, temperature, media)).to("cpu")

    def logits(self, sequences, attention_mask, prompt_width: int, temperature: float, media: dict):
        return self.teacher.logits(*self._on_device(sequences, attention_mask, prompt_width, temperature, media)).to("cpu")


def actor_resources(cfg: OmniConfig) -> dict[str, Any]:
    """What one pool actor reserves: one CPU and one device of the trainer's kind (none on a CPU
    machine), as a training worker does (`ResourcePool.actor_options`)."""
    kind = ray_device_resource(cfg.trainer.device)
    if kind == "GPU":
        return {"num_cpus": 1, "num_gpus": 1}
    if kind == "NPU":
        return {"num_cpus": 1, "resources": {"NPU": 1}}
    return {"num_cpus": 1}


class TeacherPools:
    """The pooled teachers' actors of one run, started on the driver, named for the training
    processes to find (module docstring); `close` ends them."""

    def __init__(self, cfg: OmniConfig):
        import ray

        self.actors: list = []
        blocks = teachers_of(cfg.algo.family_options)
        threads = 1  # as a training worker's (WorkerGroup): its device does the work
        try:
            for index, t in enumerate(blocks):
                if not t.pooled:
                    continue
                remote = ray.remote(max_restarts=0, max_task_retries=0, **actor_resources(cfg))(TeacherWorker)
                for i in range(t.pool_workers):
                    name = pool_actor_name(cfg, t.name, i)
                    self.actors.append(remote.options(name=name).remote(cfg, index, threads))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001  (already gone with Ray: nothing left to end)
                pass
        self.actors = []


def asked_devices(cfg: OmniConfig) -> list[tuple[str, int]]:
    """The devices a run asks for, by what takes them: (who, how many), each named by its key."""
    t = cfg.trainer
    ranks = t.backend_options.world_size if t.backend == "ray" else 1
    asked = [(f"{ranks} training rank(s) (trainer.backend={t.backend}"
              + (", nnodes x devices_per_node)" if t.backend == "ray" else ")"), ranks)]
    workers = cfg.reward.worker_options
    rewards = math.ceil(workers.num_workers * workers.num_gpus)
    if rewards:
        asked.append((f"{rewards} for reward workers (reward.worker_options: {workers.num_workers} x num_gpus "
                      f"{workers.num_gpus})", rewards))
    for t_ in pooled_teachers(cfg):
        asked.append((f"{t_.pool_workers} for teacher {t_.name!r}'s pool ({KEY}: pool_workers)", t_.pool_workers))
    return asked


def check_device_budget(cfg: OmniConfig) -> None:
    """The devices the run asks for (training ranks, reward workers' GPUs, teacher pools) fit this
    machine's, checked at load where they can be counted: a run on accelerators that starts its
    own Ray (no `ray_address`) or runs in one process. One `DeviceError` line otherwise."""
    kind = ray_device_resource(cfg.trainer.device)
    joins = cfg.trainer.backend == "ray" and cfg.trainer.backend_options.ray_address
    if kind is None or joins:
        return  # CPU workers share the cores; a cluster's devices are counted by its placement
    asked = asked_devices(cfg)
    total = sum(n for _, n in asked)
    have = device_count({"GPU": "cuda", "NPU": "npu"}[kind])
    if total > have:
        pooled = pooled_teachers(cfg)
        hint = (f"lower pool_workers or put a teacher beside the student ({KEY}[*].placement=colocated), "
                if pooled else "")
        raise DeviceError(f"the run asks for {total} {kind} devices ({' + '.join(w for w, _ in asked)}), this machine "
                          f"has {have}: no devices left; {hint}use fewer training ranks or reward workers, or join a "
                          f"larger cluster (trainer.backend=ray, trainer.backend_options.ray_address)")


__all__ = ["TeacherPools", "TeacherWorker", "asked_devices", "check_device_budget"]

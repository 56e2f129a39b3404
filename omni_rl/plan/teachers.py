"""The teachers of a plan (on-policy distillation): their weights and their forward on the devices.

A colocated teacher (`omni_rl.families.teachers`, `placement: colocated`) is built by each
training rank beside the student, in the model's dtype, so its weights add to both peaks of every
training device: whole in one process, and with FSDP2 on Ray its denoiser 1/world of it (sharded
like the actor; its encoders and decoder whole). A pooled teacher (`placement: pool`) is whole on
each device of its pool and nothing on the training devices: its pool's peak is its weights and
its forward (`pools`). A teacher that is the student's own base (no `path`, no `lora`,
LoRA training) holds no weights of its own. Any other is built weightless from its architecture
folder (`architecture_folder(path)`, the student's `model.path` when it has none) and counted
whole: its trained network(s) and, where the build has them, its own encoders and decoder.
Teachers of one base (`path`, `revision`) share one copy (their LoRAs are adapters on it), so
the base is counted once. A teacher's LoRA file is not read (it need not exist when planning; it
is small beside the base).

Its forward runs in the update, with no gradient, while the student's micro-batch holds its
activations: the training peak gains the larger teacher forward, traced on fake tensors at the
micro-batch's size (a denoiser's at the teacher's guidance copies; a text model's over the prompt
and response). Its FLOPs are `steps.teacher_flops`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from omni_rl.families.teachers import shares_student, teacher_source, teachers_of
from omni_rl.plan.architecture import architecture_folder
from omni_rl.plan.trace import LiveBytes, Trace
from omni_rl.plan.weights import build_weightless, engine_tensors, world_size


def sharded_world(cfg) -> int:
    """The ranks a colocated teacher is sharded over: the FSDP2 world on Ray (as
    `families.teachers.shards_teachers` decides at run time), 1 otherwise."""
    return world_size(cfg) if cfg.trainer.backend == "ray" else 1


def plan_teacher_weights(cfg, cache: dict) -> dict[str, Any]:
    """Each teacher's parameters and where they sit (module docstring): a JSON-able dict with the
    bytes every training device holds (`device_bytes`) and each pool's (`pools`)."""
    rows, pools, device_bytes = [], [], 0
    world = sharded_world(cfg)
    holder: dict[tuple, str] = {}  # (path, revision) -> the colocated teacher whose row counts that base
    for t in teachers_of(cfg.algo.family_options):
        if not t.pooled and shares_student(cfg, t):
            rows.append({"teacher": t.name, "path": None, "shares_student": True, "parameters": 0, "bytes": 0,
                         "where": "the student's own weights, LoRA off"})
            continue
        path, revision = teacher_source(cfg, t)
        if not t.pooled and (path, revision) in holder:
            rows.append({"teacher": t.name, "path": path, "lora": t.lora, "shares_student": False, "parameters": 0,
                         "bytes": 0, "where": f"the base of teacher {holder[path, revision]!r}, shared (its LoRA an "
                                              f"adapter on it)"})
            continue
        key = ("teacher", path)
        if key not in cache:
            model_cfg = dataclasses.replace(cfg.model, path=path, lora=dataclasses.replace(cfg.model.lora, enabled=False))
            built = build_weightless(dataclasses.replace(cfg, model=model_cfg), architecture_folder(path))
            tensors = list(engine_tensors(built.model, "local", built.frozen))
            params = sum(torch.Size(s.shape).numel() for s in tensors)
            sizes = [torch.Size(s.shape).numel() * torch.empty((), dtype=s.dtype, device="meta").element_size()
                     for s in tensors]
            # What FSDP2 shards: the denoiser(s) (their trainable_root); encoders and decoder stay whole.
            network = sum(p.numel() * p.element_size() for p in built.model.trainable_root().parameters())
            cache[key] = (params, sum(sizes), network, built.complete or built.frozen_planned)
        params, size, network, whole = cache[key]
        counted = "the whole model" if whole else "its trained network(s) only"
        if t.pooled:
            # Its peak: the weights, until the planner adds the traced forward (`planner._core`).
            pools.append({"teacher": t.name, "workers": t.pool_workers, "weights_bytes": size, "peak_bytes": size})
            rows.append({"teacher": t.name, "path": path, "lora": t.lora, "shares_student": False, "parameters": params,
                         "bytes": size, "where": f"its pool: {t.pool_workers} device(s) of its own, whole on each",
                         "counted": counted})
            continue
        holder[path, revision] = t.name
        on_device = size if world == 1 else size - network + -(-network // world)
        device_bytes += on_device
        where = ("every training device, whole (colocated)" if world == 1 else
                 f"every training device, its denoiser 1/{world} of it (colocated, FSDP2-sharded)")
        rows.append({"teacher": t.name, "path": path, "lora": t.lora, "shares_student": False, "parameters": params,
                     "bytes": on_device, "where": where, "counted": counted})
    return {"models": rows, "device_bytes": device_bytes, "pools": pools}


def colocated(cfg) -> bool:
    """Some teacher runs beside the student (its forward then adds to the training peak)."""
    return any(not t.pooled for t in teachers_of(cfg.algo.family_options))


def trace_teacher_forward(model, spec, cfg, cache: dict) -> Trace | None:
    """The teacher's no-grad forward on one micro-batch, traced with the student's architecture
    (a teacher must share it); None without teachers."""
    if not teachers_of(cfg.algo.family_options):
        return None
    if spec.modality == "text":
        from omni_rl.plan.text_steps import text_lengths

        prompt, response = text_lengths(cfg)
        key = ("teacher-text", id(model), cfg.trainer.micro_batch_size, prompt, response)
        if key not in cache:
            with cache[("mode", id(model), True)]:
                cache[key] = _trace_text_forward(model, spec, cfg.trainer.micro_batch_size, prompt, response,
                                                 float(cfg.rollout.sampling_options.temperature))
        return cache[key]
    from omni_rl.plan.steps import _trace_all, guidance_copies

    batch = cfg.trainer.micro_batch_size * guidance_copies(cfg)
    key = ("teacher", batch, id(model), cfg.rollout.sampling_options.height, cfg.rollout.sampling_options.width, cfg.rollout.sampling_options.num_frames)
    if key not in cache:
        cache[key] = _trace_all(model, spec, cfg, batch, False, cache[("mode", id(model), True)])
    return cache[key]


def _trace_text_forward(model, spec, batch: int, prompt: int, response: int, temperature: float) -> Trace:
    """As the teacher's `token_log_probs` runs: the response positions' logits, tempered, their
    log-softmax and the sampled tokens' entries."""
    from omni_rl.plan.text_steps import response_log_probs

    with torch.no_grad():
        live = LiveBytes(model.trainable_module())
        with live:
            response_log_probs(model, spec, batch, prompt, response, temperature)  # traced, then dropped
    return Trace(int(live.flops), int(live.peak), int(live.weight_read), int(live.expert_read))


__all__ = ["plan_teacher_weights", "trace_teacher_forward", "colocated", "sharded_world"]

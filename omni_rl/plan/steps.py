"""The traced part of a plan: one rollout forward and one training micro-batch, and a step's FLOPs
(a text model's: `text_steps.py`).

For a denoiser: one no-grad forward of `max_num_seqs` samples and one forward and backward of
`micro_batch_size` samples, both doubled under CFG, the larger trained module kept. A step's
FLOPs scale these by the step's sizes (every step trained: an upper bound), plus a reference
forward with `algo.kl_coef > 0`.

Teachers (`algo.family_options.teachers`) add one forward per trained pass, at their own guidance.
Not traced: text encoders, the VAE and rewards (listed as not counted).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from omni_rl.families.sampling import DiffusionSampling
from omni_rl.families.teachers import teachers_of
from omni_rl.plan.trace import Trace, fake_mode, materialize, trace


@dataclass(frozen=True)
class StepTrace:
    rollout: Trace
    train: Trace
    rollout_batch: int
    train_batch: int
    # Passes per sample the traces stand for: a denoiser's `rollout.sampling_options.num_steps` (None: read from the
    # recipe); a text model's traces already cover a whole sequence (1).
    steps_per_sample: int | None = None


def student_guidance(cfg) -> float:
    """The student's CFG scale: a diffusion model's `rollout.sampling_options.guidance_scale`; a text
    model samples without guidance (1.0)."""
    sampling = cfg.rollout.sampling_options
    return sampling.guidance_scale if isinstance(sampling, DiffusionSampling) else 1.0


def cfg_copies(cfg) -> int:
    return 2 if student_guidance(cfg) > 1.0 else 1


def guidance_copies(cfg) -> int:
    """Rows per sample of the largest teacher forward: 2 where a teacher guides with CFG (its own
    scale, else the student's); 0 without teachers."""
    scales = [student_guidance(cfg) if t.guidance_scale is None else t.guidance_scale
              for t in teachers_of(cfg.algo.family_options)]
    return max((2 if s > 1.0 else 1) for s in scales) if scales else 0


def trace_step(model, spec, cfg, fake: bool = True, cache: dict | None = None) -> StepTrace:
    """Trace the rollout forward and the training micro-batch of `model`'s trained network(s);
    each trace is kept in `cache` under what it depends on, so a re-plan that changes one knob
    traces only what that knob changes."""
    cache = {} if cache is None else cache
    copies = cfg_copies(cfg)
    rollout_batch, train_batch = cfg.rollout.max_num_seqs * copies, cfg.trainer.micro_batch_size * copies
    r = cfg.rollout.sampling_options
    shape = (id(model), r.height, r.width, r.num_frames, fake)
    roll_key, train_key = ("rollout", rollout_batch, *shape), ("train", train_batch, *shape)
    mode_key = ("mode", id(model), fake)
    if mode_key not in cache:  # one mode per model: its tensors are made once, in that mode
        cache[mode_key] = mode = fake_mode() if fake else _null()
        with mode:
            for module in model.trainable_modules().values():
                materialize(module, fake)
    mode = cache[mode_key]
    if roll_key not in cache:
        cache[roll_key] = _trace_all(model, spec, cfg, rollout_batch, False, mode)
    if train_key not in cache:
        cache[train_key] = _trace_all(model, spec, cfg, train_batch, True, mode)
    return StepTrace(cache[roll_key], cache[train_key], rollout_batch, train_batch)


def _trace_all(model, spec, cfg, batch: int, backward: bool, mode) -> Trace:
    """The larger trace over the trained modules (one runs at a time)."""
    traces = []
    with mode:
        for name, module in model.trainable_modules().items():
            # diffusers checkpoints only in training mode; the update runs it so when checkpointing.
            module.train(backward and cfg.model.gradient_checkpointing)
            traces.append(trace(module, lambda: spec.forward_inputs(model, cfg, batch)[name], backward=backward))
            module.eval()
    return max(traces, key=lambda t: (t.activation_bytes, t.flops))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def step_flops(cfg, step: StepTrace) -> dict[str, float]:
    """FLOPs of one training step (module docstring)."""
    t, r = cfg.trainer, cfg.rollout
    steps = r.sampling_options.num_steps if step.steps_per_sample is None else step.steps_per_sample
    samples = t.prompts_per_step * t.samples_per_prompt
    rollout = samples / r.max_num_seqs * steps * step.rollout.flops
    passes = cfg.algo.ppo_epochs * samples * steps / t.micro_batch_size
    # A reference forward on a micro-batch: the rollout forward's FLOPs scaled to its batch.
    reference = step.rollout.flops * step.train_batch / step.rollout_batch if cfg.algo.kl_coef > 0 else 0.0
    update = passes * (step.train.flops + reference + teacher_flops(cfg, step))
    return {"rollout": rollout, "update": update, "total": rollout + update}


def teacher_flops(cfg, step: StepTrace) -> float:
    """A micro-batch's teacher forward: the rollout forward's FLOPs scaled to its batch and to the
    teacher's guidance copies (the rollout trace holds the student's, `cfg_copies`)."""
    copies = guidance_copies(cfg)
    if not copies:  # no teachers
        return 0.0
    return step.rollout.flops / cfg_copies(cfg) * copies * step.train_batch / step.rollout_batch


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b)


def as_dict(step: StepTrace) -> dict[str, Any]:
    return {
        "rollout_forward": {"batch": step.rollout_batch, "flops": step.rollout.flops,
                            "activation_bytes": step.rollout.activation_bytes},
        "train_micro_batch": {"batch": step.train_batch, "flops": step.train.flops,
                              "activation_bytes": step.train.activation_bytes},
    }


__all__ = ["StepTrace", "trace_step", "step_flops", "as_dict", "torch"]

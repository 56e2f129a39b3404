"""`--plan`: the whole plan of a recipe, its verdict against a device, and the console table.

`make_plan(cfg, kind, memory_gb)` builds the model weightless, plans its weights per rank,
traces one rollout forward and one training micro-batch on fake tensors, and adds them up per
device: the training and rollout peaks (resident weights and state, the pass's activations, the
step's trajectories where they live), the driver's host memory, and reward models on the
training devices. When a peak exceeds the device, each knob of `KNOBS` is re-planned alone and
its new peaks listed: what a knob saves is computed, not estimated. docs/plan.md reads a plan.
"""
from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any, Callable

from omni_rl.config.options import recipe_values, replace_options
from omni_rl.config.schema import OmniConfig
from omni_rl.families.sampling import DiffusionSampling
from omni_rl.models.limits import trajectory_sample_bytes
from omni_rl.plan.architecture import architecture_folder
from omni_rl.plan.devices import DEFAULT_DEVICE_KIND, device_kind, device_memory_bytes
from omni_rl.plan.host import materialised_bytes, plan_driver, trajectories_on_host
from omni_rl.plan.rewards import plan_rewards
from omni_rl.plan.roofline import roofline
from omni_rl.plan.steps import as_dict, step_flops, trace_step
from omni_rl.plan.teachers import colocated, plan_teacher_weights, trace_teacher_forward
from omni_rl.plan.text_steps import agent_images, text_trajectory_bytes, trace_text_step
from omni_rl.plan.weights import _count, _size, build_weightless, weights_of

NOT_COUNTED = (
    "FSDP2's all-gathered blocks and communication buffers during a forward",
    "each sample's conditioning (prompt embeddings) kept with its trajectory",
    "text encoders' and VAE's activations (prompt encoding, decoding)",
    "reward models' activations while they score",
    "allocator fragmentation, the CUDA/NPU context",
)


def _spec(cfg: OmniConfig):
    from omni_rl.models.registry import adapter_key
    from omni_rl.plan.spec import PLAN_SPECS

    key = adapter_key(cfg.model.adapter, cfg.model.stage)
    return PLAN_SPECS.get(key) if key in PLAN_SPECS else None


def _core(cfg: OmniConfig, cache: dict) -> dict[str, Any]:
    """Weights, traces and per-device peaks of `cfg` (builds and traces memoised in `cache`)."""
    folder = architecture_folder(cfg.model.path)
    build_key = (cfg.model.lora.enabled, cfg.model.gradient_checkpointing)
    if build_key not in cache:
        cache[build_key] = build_weightless(cfg, folder)
        # Before any trace: a trace gives the trained modules (fake) tensors off the meta device.
        built = cache[build_key]
        cache[("materialised", build_key)] = materialised_bytes([*built.model.trainable_modules().values(), *built.frozen])
    built = cache[build_key]
    materialised = cache[("materialised", build_key)]
    plan = weights_of(cfg, folder, built)
    if "rewards" not in cache:
        cache["rewards"] = plan_rewards(cfg)  # no knob changes the rewards
    plan["reward_models"] = cache["rewards"]
    # On-policy distillation's teachers: colocated ones on every training device (sharded with
    # FSDP2 on Ray), pooled ones on devices of their own.
    plan["teachers"] = plan_teacher_weights(cfg, cache)
    plan["teacher_pools"] = plan["teachers"].pop("pools")
    spec = _spec(cfg)
    device = (plan["per_device_bytes"]["device_total"] + plan["reward_models"]["device_bytes"]
              + plan["teachers"]["device_bytes"])
    text = spec is not None and spec.modality == "text"
    pixels = spec is not None and spec.modality == "diffusion"
    r, t = cfg.rollout, cfg.trainer
    samples = t.prompts_per_step * t.samples_per_prompt
    if spec is None or (spec.forward_inputs is None and not text):
        plan["trace"] = None
        plan["not_counted"].append("activations and FLOPs: the adapter registers no forward for the planner")
        plan["not_counted"].append("stored trajectories (on the device, and on the driver in a Ray run)")
        plan["peaks"] = {"training": device, "rollout": device, "trajectories": 0}
        plan["driver"] = plan_driver(cfg, materialised, samples, 0, pixels, plan["reward_models"])
        return plan
    per_rank = -(-samples // plan["devices"]["world_size"])
    if text:
        images = agent_images(cfg, built.model)
        if images is not None:
            plan["agent_images"] = images
            plan["not_counted"].append("the vision tower's activations on an agent's fed images")
        step = trace_text_step(built.model, spec, cfg, cache=cache.setdefault("traces", {}))
        per_sample = text_trajectory_bytes(cfg, built.model)  # recorded routes included (routing_replay=r3)
    else:
        step = trace_step(built.model, spec, cfg, cache=cache.setdefault("traces", {}))
        per_sample = trajectory_sample_bytes(r.sampling_options.num_steps, _latent_numel(spec, built.model, cfg))
    trajectories = 0 if trajectories_on_host(cfg) else per_rank * per_sample
    plan["driver"] = plan_driver(cfg, materialised, samples, per_sample, pixels, plan["reward_models"])
    plan["trace"] = as_dict(step)
    plan["flops_per_step"] = step_flops(cfg, step)
    cache["step"] = (step, list(built.model.trainable_modules().values()))
    # The teacher's no-grad forward runs while the student's micro-batch holds its activations.
    teacher = trace_teacher_forward(built.model, spec, cfg, cache.setdefault("traces", {}))
    forward_bytes = 0 if teacher is None else teacher.activation_bytes
    if teacher is not None:
        plan["trace"]["teacher_forward"] = {"batch": cfg.trainer.micro_batch_size, "flops": teacher.flops,
                                            "activation_bytes": forward_bytes}
    # A pool's device holds its teacher and that teacher's forward (at most the micro-batch's rows).
    for pool in plan["teacher_pools"]:
        pool["peak_bytes"] = pool["weights_bytes"] + forward_bytes
    teacher_bytes = forward_bytes if colocated(cfg) else 0
    plan["peaks"] = {"training": device + step.train.activation_bytes + teacher_bytes + trajectories,
                     "rollout": device + step.rollout.activation_bytes + trajectories,
                     "trajectories": trajectories}
    return plan


def _latent_numel(spec, model, cfg) -> int:
    """Elements of one sample's latent: the spec's `latent_numel`, else the first tensor argument
    of a one-row forward."""
    import torch

    from omni_rl.plan.trace import fake_mode

    if spec.latent_numel is not None:
        return int(spec.latent_numel(model, cfg))
    with fake_mode():
        inputs = next(iter(spec.forward_inputs(model, cfg, 1).values()))
    first = next(v for v in inputs.values() if isinstance(v, torch.Tensor))
    return first.numel()


def _with(cfg: OmniConfig, change: Callable[[OmniConfig], None]) -> OmniConfig:
    new = copy.deepcopy(cfg)
    change(new)
    return new


def _knobs(cfg: OmniConfig) -> list[tuple[str, Callable[[OmniConfig], None]]]:
    knobs = []
    if cfg.trainer.micro_batch_size > 1:
        knobs.append(("trainer.micro_batch_size=1", lambda c: setattr(c.trainer, "micro_batch_size", 1)))
    if not cfg.model.gradient_checkpointing:
        knobs.append(("model.gradient_checkpointing=true", lambda c: setattr(c.model, "gradient_checkpointing", True)))
    if cfg.trainer.engine == "fsdp2":
        knobs.append(("trainer.engine_options.param_offload=true", lambda c: setattr(
            c.trainer, "engine_options", replace_options(c.trainer.engine_options, param_offload=True))))
        knobs.append(("trainer.engine_options.optimizer_offload=true", lambda c: setattr(
            c.trainer, "engine_options", replace_options(c.trainer.engine_options, optimizer_offload=True))))
        per_node = recipe_values(cfg.trainer.backend_options).get("devices_per_node")
        if per_node:
            knobs.append((f"trainer.backend_options.nnodes={2 * cfg.trainer.backend_options.nnodes}", lambda c: setattr(
                c.trainer, "backend_options", replace_options(c.trainer.backend_options,
                                                              nnodes=2 * c.trainer.backend_options.nnodes))))
    if cfg.rollout.max_num_seqs > 1:
        half = max(1, cfg.rollout.max_num_seqs // 2)
        knobs.append((f"rollout.max_num_seqs={half}", lambda c: setattr(c.rollout, "max_num_seqs", half)))
    sampling = cfg.rollout.sampling_options
    if isinstance(sampling, DiffusionSampling) and sampling.num_frames > 1:
        knobs.append(("rollout.sampling_options.num_frames=1 (fewest)",
                      lambda c: setattr(c.rollout.sampling_options, "num_frames", 1)))
    return knobs


def peak_bytes(plan: dict[str, Any]) -> int:
    """The largest peak of any one device: a training device's (training or rollout), or a teacher
    pool's (a device of the same kind: it must fit as well)."""
    return max(plan["peaks"]["training"], plan["peaks"]["rollout"], *[p["peak_bytes"] for p in plan["teacher_pools"]])


def make_plan(cfg: OmniConfig, kind_name: str = DEFAULT_DEVICE_KIND, memory_gb: float | None = None) -> dict[str, Any]:
    """The full plan of `cfg` as a JSON-able dict (module docstring)."""
    kind = device_kind(kind_name)
    limit = device_memory_bytes(kind, memory_gb)
    started = time.monotonic()
    cache: dict = {}
    plan = _core(cfg, cache)
    plan["not_counted"].extend(NOT_COUNTED)
    world = plan["devices"]["world_size"]
    if "flops_per_step" in plan:
        step, modules = cache["step"]
        plan["roofline"] = roofline(cfg, step, modules, world, kind)
        plan["best_case_step_seconds"] = plan["roofline"]["best_case_step_seconds"]
    peak = peak_bytes(plan)
    # Without a trace the peaks are the weights alone: "fits" then means only that they do.
    verdict: dict[str, Any] = {"device_kind": kind.name, "device_memory_bytes": limit, "peak_bytes": peak,
                               "fits": peak <= limit, "weights_only": plan["trace"] is None, "knobs": []}
    if not verdict["fits"]:
        for label, change in _knobs(cfg):
            try:
                other = _core(_with(cfg, change), cache)
            except ValueError as err:  # a geometry the model refuses (MiniMax-H3 takes 124 frames at least)
                verdict["knobs"].append({"knob": label, "refused": str(err)})
                continue
            new_peak = peak_bytes(other)
            verdict["knobs"].append({"knob": label, "peak_bytes": new_peak, "saves_bytes": peak - new_peak,
                                     "fits": new_peak <= limit})
    plan["verdict"] = verdict
    plan["plan_seconds"] = round(time.monotonic() - started, 1)
    return plan


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as console lines."""
    from omni_rl.plan.weights import format_table

    lines = [format_table(plan)]
    peaks, v = plan["peaks"], plan["verdict"]
    lines += _reward_lines(plan["reward_models"])
    lines += _teacher_lines(plan)
    if plan.get("trace"):
        tr = plan["trace"]
        lines += [
            f"  traced (fake tensors): rollout forward of {tr['rollout_forward']['batch']} rows, peak "
            f"{_size(tr['rollout_forward']['activation_bytes'])}; training micro-batch of "
            f"{tr['train_micro_batch']['batch']} rows, peak {_size(tr['train_micro_batch']['activation_bytes'])}",
            f"  stored trajectories per device: {_size(peaks['trajectories'])}",
        ]
        for tool in plan.get("agent_images", {}).get("tools", []):
            lines.append(
                f"  agent images ({tool['tool']}): the longest trajectory ({plan['agent_images']['max_total_tokens']} "
                f"tokens after the prompt, traced) holds {tool['image_tokens_one_call_a_turn']} fed image tokens at one "
                f"call a tool turn ({tool['images_one_call_a_turn']} images of {tool['height']}x{tool['width']} px, "
                f"{tool['tokens_per_image']} tokens each); its budget holds {tool['images_at_most']} such images at most")
        f, roof = plan["flops_per_step"], plan["roofline"]
        lines.append(f"  FLOPs per step: {f['total']:.3e} (rollout {f['rollout']:.3e}, update {f['update']:.3e})")
        lines.append(f"  best case on {v['device_kind']} (roofline): {_secs(plan['best_case_step_seconds'])} s/step; "
                     + "; ".join(f"{name} {_secs(p['seconds'])} s, {p['bound']}-bound (FLOPs {_secs(p['flop_seconds'])} s, "
                                 f"memory {_secs(p['memory_seconds'])} s: {_size(int(p['bytes_read_per_device']))} read a device)"
                                 for name, p in ((n, roof[n]) for n in ("rollout", "update"))))
    lines.append(f"  per-device peak: training {_size(peaks['training'])}, rollout {_size(peaks['rollout'])}")
    lines += _driver_lines(plan["driver"])
    what = "the weights alone (activations not traced) " if v["weights_only"] else ""
    lines.append(f"  verdict: {what}{'fit' if v['fits'] else 'do not fit' if what else 'does not fit'}"
                 f"{'s' if v['fits'] and not what else ''} on {v['device_kind']} ({v['device_memory_bytes'] / 1e9:.0f} GB)")
    for k in v["knobs"]:
        if "refused" in k:
            lines.append(f"    {k['knob']}: the model refuses it ({k['refused']})")
            continue
        lines.append(f"    {k['knob']}: peak {_size(k['peak_bytes'])} (saves {_size(max(0, k['saves_bytes']))})"
                     f"{', fits' if k['fits'] else ''}")
    return "\n".join(lines)


def _secs(s: float) -> str:
    return f"{s:.1f}" if s >= 0.1 else f"{s:.2g}"


def _driver_lines(driver: dict[str, Any]) -> list[str]:
    b = driver["bytes"]
    weights = (f"policy weights {_size(b['policy_weights'])} (the weightless build)" if driver["weightless_build"]
               else "policy weights on the device (it is the rank)")
    trajectories = (f"the whole step's trajectories {_size(b['trajectories'])}" if driver["trajectories_on_host"]
                    else "trajectories on the device")
    return [f"  driver process, host: {_size(driver['total'])}: {weights}; {trajectories}; decoded samples "
            f"{_size(b['decoded_samples'])}; reward models on the host {_size(b['reward_models'])}"]


def _teacher_lines(plan: dict[str, Any]) -> list[str]:
    teachers = plan["teachers"]["models"]
    if not teachers:
        return []
    lines = [f"  teachers on every training device: {_size(plan['teachers']['device_bytes'])} (in both peaks)"]
    for t in teachers:
        what = (t["where"] if t["shares_student"] or not t["bytes"] else
                f"{t['path']}, {_count(t['parameters'])} parameters, {_size(t['bytes'])} on {t['where']} "
                f"({t['counted']})")
        lines.append(f"    {t['teacher']}: {what}")
    forward = (plan.get("trace") or {}).get("teacher_forward")
    if forward:
        lines.append(f"    forward of a micro-batch (no gradient; in the training peak where a teacher is colocated): "
                     f"{_size(forward['activation_bytes'])}")
    for pool in plan["teacher_pools"]:
        lines.append(f"    pool of {pool['teacher']}: {pool['workers']} device(s), peak "
                     f"{_size(pool['peak_bytes'])} each (its weights and forward)")
    return lines


def _reward_lines(rewards: dict[str, Any]) -> list[str]:
    held = [m for m in rewards["models"] if m["network"] is not None]
    if not held:
        return ["  reward models: none on a device"]
    lines = [f"  reward models on a training device: {_size(rewards['device_bytes'])} (in both peaks)"]
    for m in held:
        lines.append(f"    {m['reward']} ({m['use']}): {m['network']}, {m['parameters'] / 1e6:.1f}M parameters "
                     f"{m['dtype']}, {_size(m['bytes'])}, on {m['where']}")
    return lines


def run_plan(cfg: OmniConfig, kind_name: str = DEFAULT_DEVICE_KIND, memory_gb: float | None = None) -> Path:
    """Plan `cfg`, print the table, write plan.json atomically into `trainer.output_dir`; returns
    its path. The folder is checked and held first (`hold_plan_folder`), before anything is built."""
    from omni_rl.utils.atomic import atomic_write_json

    folder = hold_plan_folder(cfg.trainer.output_dir)
    try:
        plan = make_plan(cfg, kind_name, memory_gb)
        print(format_plan(plan))
        return atomic_write_json(folder.path / "plan.json", plan)
    finally:
        folder.release()


def hold_plan_folder(output_dir: str):
    """`output_dir` as the trainer takes it (`omni_rl.trainer.run_dir`: a folder this process can
    write, and its lock, so that a running run's folder is refused naming its holder), and one
    that holds no run: a plan.json never lands among another run's metrics or checkpoints.
    `RunDirError` otherwise; the caller releases the lock when plan.json is written."""
    from omni_rl.trainer.run_dir import RunDirError, check_output_dir, hold, previous_run

    folder = hold(check_output_dir(output_dir))
    previous = previous_run(folder.path)
    if previous:
        folder.release()
        raise RunDirError(
            f"trainer.output_dir={output_dir!r} holds another run ({previous}); --plan writes plan.json only into "
            f"a folder without a run, so as not to mix with that run's outputs: set trainer.output_dir to a new "
            f"folder for the plan"
        )
    return folder


__all__ = ["make_plan", "format_plan", "run_plan"]

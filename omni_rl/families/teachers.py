"""Frozen teachers of on-policy distillation: which teacher scores which sample, and its forward.

A teacher (`algo.family_options.teachers`, one block each, bound to `TeacherOptions`) is a frozen
model of the student's family: another checkpoint (`path`), a LoRA loaded onto one (`lora`: what a
run exports to OUTPUT/lora), or the student's own base (neither: with LoRA training that is the
student's model with its LoRA disabled, no second copy) with guidance of its own (`guidance_scale`).
Each teaches the prompts whose metadata[metadata_key] equals its `data_source`; a teacher without
one teaches every prompt no other claims. A prompt that no teacher covers is one error line when
the prompts load (`check_routes`), not a failure in the middle of a run.

At load (`build_teachers`) a teacher must be of the student's architecture (the `_class_name` of
its model_index.json, or the `architectures` of its config.json) and of its latent space (the
same latent shape at the rollout's geometry, and the same pixels when both decode one latent);
either failing is one `TeacherConfigError` line. Its parameters never train (requires_grad off,
and they are not the engine's), which `Teacher.checksum` lets a test confirm.

The teachers are colocated: built in the trainer's process (each Ray rank builds its own) on the
student's device. Teachers of one base (the same `path` and `revision`) share one frozen copy of
it: each LoRA is loaded onto it as an adapter named after its teacher, and a teacher's forward
runs with its own adapter alone (a teacher without `lora` with none), so two LoRA teachers of
SD3.5 hold one transformer, not two. A separate pool of teacher workers is not built here.

`teacher_step_means` scores one trained step of a micro-batch: each teacher predicts its velocity
at the student's stored state, for its own samples, under no gradient, and the very kernel that
sampled the step turns it into the teacher's transition mean. Its output is checked like a
reward's: the shape of the latent, every value finite.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from omni_rl.algos import latent_streams as ls
from omni_rl.algos.flow_sde import get_step_kernel, step_latents
from omni_rl.option import ComponentOptions, option
from omni_rl.errors import OmniConfigError, OmniRunError
from omni_rl.models.factory import build_model
from omni_rl.models.loading import pipeline_index, resolve_model_path

LORA_FILES = ("pytorch_lora_weights.safetensors",)


class TeacherConfigError(OmniConfigError):
    """A teacher that cannot teach this student, or prompts that no teacher covers."""


class TeacherOutputError(OmniRunError):
    """A teacher's prediction of the wrong shape, or not finite."""


@dataclass
class TeacherOptions(ComponentOptions):
    """One teacher (an entry of `algo.family_options.teachers`)."""

    name: str = option("teacher", "Its name in the metrics (distill/<name>/kl) and in messages; one per teacher.")
    path: Optional[str] = option(None, "Its model folder or hub id, of the student's architecture; null: the "
                                       "student's model.path.")
    revision: Optional[str] = option(None, "The hub revision of `path`.")
    lora: Optional[str] = option(None, "A diffusers LoRA loaded onto it (pytorch_lora_weights.safetensors, as a run "
                                       "exports it in OUTPUT/lora, or its folder); null: none.")
    guidance_scale: Optional[float] = option(None, "Its own guidance scale; null: the student's rollout.sampling_options.guidance_scale.")
    data_source: Optional[str] = option(None, "It teaches the prompts whose metadata[metadata_key] equals this; null: "
                                              "every prompt no other teacher claims (the default teacher).")
    metadata_key: str = option("data_source", "The field of a prompt row's metadata that routes it (one for all teachers).")

    def check(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"name={self.name!r}: expected a non-empty name without '/' (it names metrics)")
        if self.guidance_scale is not None and not self.guidance_scale >= 0:
            raise ValueError(f"guidance_scale={self.guidance_scale!r}: expected >= 0 (1 = no guidance), or null for "
                             f"the student's rollout.sampling_options.guidance_scale")
        if not self.metadata_key:
            raise ValueError("metadata_key='': expected the name of a metadata field (data_source)")


def check_teachers(teachers: list[TeacherOptions], key: str = "algo.family_options.teachers") -> list[TeacherOptions]:
    """The teachers' blocks (bound at load, each a `TeacherOptions`) checked together: names
    unique, one data source per teacher, at most one default, one metadata key."""
    for attr, what in (("name", "name"), ("data_source", "data_source")):
        values = [getattr(t, attr) for t in teachers]
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            hint = "give each its own" if attr == "name" else "one teacher per data source (null: the one default)"
            raise TeacherConfigError(f"{key}: {what} {', '.join(twice)} appears more than once; {hint}")
    keys = sorted({t.metadata_key for t in teachers})
    if len(keys) > 1:
        raise TeacherConfigError(f"{key}: metadata_key {', '.join(keys)}: expected one field for all teachers (a "
                                 f"prompt is routed by one field)")
    return list(teachers)


def teachers_of(options) -> list[TeacherOptions]:
    """A family's bound options' teachers ([] for a family whose options declare none)."""
    return list(options.teachers) if "teachers" in {f.name for f in dataclasses.fields(options)} else []


def route(teachers: list[TeacherOptions], metadata: dict[str, Any]) -> Optional[int]:
    """The index of the teacher of a prompt with this metadata: the one of its data source, else
    the default; None when neither exists."""
    if not teachers:
        return None
    value = (metadata or {}).get(teachers[0].metadata_key)
    default = None
    for i, t in enumerate(teachers):
        if t.data_source is None:
            default = i
        elif value is not None and str(value) == t.data_source:
            return i
    return default


def check_routes(teachers: list[TeacherOptions], items: list, what: str) -> None:
    """Every prompt of `items` (PromptItems) has a teacher; else one line naming the first that has none."""
    if not teachers:
        return
    for n, item in enumerate(items):
        if route(teachers, item.metadata) is None:
            k = teachers[0].metadata_key
            value = (item.metadata or {}).get(k)
            sources = ", ".join(str(t.data_source) for t in teachers)
            raise TeacherConfigError(
                f"{what}: prompt {n + 1} ({item.prompt[:40]!r}) has {k}={value!r}, which no teacher of "
                f"algo.family_options.teachers teaches (their data sources: {sources}); add a teacher for it, or a "
                f"default teacher (data_source: null)")


class Teacher:
    """A frozen model that predicts velocities at the student's states (see the module docstring)."""

    def __init__(self, options: TeacherOptions, model, guidance_scale: float, negative_prompt: str,
                 shares_student: bool, adapter: Optional[str] = None, adapted: tuple[str, ...] = ()):
        self.options = options
        self.name = options.name
        self.model = model
        self.guidance_scale = guidance_scale
        self.negative_prompt = negative_prompt
        self.shares_student = shares_student
        # A base shared by several teachers: its components that hold LoRA adapters (`adapted`),
        # and this teacher's adapter on them (None: the base alone).
        self.adapter = adapter
        self.adapted = adapted
        self._encoded: tuple[tuple[str, ...], Any] | None = None

    def _context(self):
        if self.shares_student:
            return self.model.reference_policy()
        self._select_adapter()
        return contextlib.nullcontext()

    def _select_adapter(self) -> None:
        """Its own LoRA alone on the shared base (teachers run one at a time)."""
        modules = self.model.trainable_modules()
        for component in self.adapted:
            if self.adapter is None:
                modules[component].disable_adapters()
            else:
                modules[component].enable_adapters()
                modules[component].set_adapters(self.adapter)

    def conditioning(self, prompts: list[str]):
        """The teacher's own encoding of the prompts (its text encoders; the negative prompt for
        its guidance). The last micro-batch's is kept: the update asks once per trained step."""
        key = tuple(prompts)
        if self._encoded is None or self._encoded[0] != key:
            with self._context():
                self._encoded = (key, self.model.encode_prompts(list(prompts), self.negative_prompt))
        return self._encoded[1]

    @torch.no_grad()
    def velocity(self, latents, sigma: torch.Tensor, micro):
        """Its velocity at the samples' states: with the student's own encoding of the prompts
        where it is the student's model (the same text encoders), else its own."""
        cond = micro.conditioning if self.shares_student else self.conditioning(micro.prompts)
        with self._context():
            return self.model.predict_velocity(latents, sigma, cond, self.guidance_scale)

    def checksum(self) -> str:
        """sha256 of the teacher's denoiser tensors (parameters and buffers, its LoRA included;
        a teacher that is the student's base leaves out the student's own LoRA)."""
        digest = hashlib.sha256()
        for component, module in sorted(self.model.trainable_modules().items()):
            state = module.state_dict()
            for name in sorted(state):
                if self.shares_student and "lora_" in name:
                    continue
                tensor = state[name].detach().to("cpu").contiguous().reshape(-1)
                digest.update(f"{component}.{name}:{tensor.dtype}:{tuple(state[name].shape)}".encode())
                digest.update(tensor.view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()


def architecture_of(path: str, revision: Optional[str], key: str) -> Optional[str]:
    """The architecture a model folder declares (its pipeline index's _class_name: model_index.json
    or modular_model_index.json; or config.json's architectures), None where it declares none."""
    folder = Path(resolve_model_path(path, revision))
    index, config = pipeline_index(folder), folder / "config.json"
    try:
        if index is not None:
            return json.loads(index.read_text()).get("_class_name")
        if config.is_file():
            names = json.loads(config.read_text()).get("architectures") or [None]
            return names[0]
    except (OSError, ValueError) as err:
        raise TeacherConfigError(f"{key}={path!r}: its model configuration does not read ({err}); expected a model "
                                 f"folder of the student's architecture") from None
    return None


def _lora_file(lora: str, key: str) -> Path:
    path = Path(lora).expanduser()
    if path.is_dir():
        path = path / LORA_FILES[0]
    if not path.is_file():
        raise TeacherConfigError(f"{key}={lora!r}: no LoRA there; expected a diffusers LoRA ({LORA_FILES[0]}), as a "
                                 f"run exports it in OUTPUT/lora, or its folder")
    return path


def _load_lora(model, file: Path, key: str, adapter: str) -> list[str]:
    """Load a diffusers LoRA onto the model's denoiser(s) as adapter `adapter`, through diffusers
    (rank and alpha from the file's metadata); every one of its layers must land on a layer of the
    model. Returns the components it landed on."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        keys = list(f.keys())
    layers = {k.split(".lora_A.")[0] for k in keys if ".lora_A." in k}
    loaded, components = 0, []
    for component, module in model.trainable_modules().items():
        mine = {k for k in layers if k.startswith(f"{component}.")}
        if not mine:
            continue
        components.append(component)
        try:
            module.load_lora_adapter(str(file.parent), weight_name=file.name, prefix=component, adapter_name=adapter)
        except (AttributeError, ValueError, RuntimeError, KeyError) as err:
            raise TeacherConfigError(f"{key}={str(file)!r} does not load onto {component} of {model.path!r}: {err}; is "
                                     f"it a LoRA of another model?") from None
        from peft.tuners.lora import LoraLayer

        loaded += sum(1 for m in module.modules() if isinstance(m, LoraLayer) and adapter in m.lora_A)
    if loaded != len(layers):
        raise TeacherConfigError(f"{key}={str(file)!r}: {len(layers)} LoRA layers in the file, {loaded} of them landed "
                                 f"on layers of {model.path!r} ({', '.join(model.trainable_modules())}); is it a LoRA of "
                                 f"another model?")
    return components


def _check_latent_space(teacher, student, cfg, key: str) -> None:
    r = cfg.rollout.sampling_options
    shape, mine = teacher.latent_shape(r.height, r.width, r.num_frames), student.latent_shape(r.height, r.width, r.num_frames)
    if shape != mine:
        raise TeacherConfigError(f"{key}: the teacher's latent at {r.height}x{r.width} is {tuple(shape)}, the "
                                 f"student's {tuple(mine)}; a teacher must share the student's latent space")
    # The same shape is not the same space: one latent, decoded by both, must give the same pixels.
    batched = {k: (1, *v) for k, v in mine.items()} if isinstance(mine, dict) else (1, *mine)
    z = ls.randn(batched, generator=torch.Generator().manual_seed(0))
    a, b = teacher.decode(ls.to(z, teacher.device)), student.decode(ls.to(z, student.device))
    if a.shape != b.shape or (a.to(torch.float32) - b.to(torch.float32)).abs().mean().item() > 1.0:
        raise TeacherConfigError(f"{key}: the teacher's decoder turns one latent into other pixels than the "
                                 f"student's; a teacher must share the student's latent space (its VAE)")


def build_teachers(cfg, student, blocks: list[TeacherOptions], key: str = "algo.family_options.teachers") -> list[Teacher]:
    """Each teacher built beside the student (on its device), frozen, and checked to fit it."""
    teachers: list[Teacher] = []
    bases: dict[tuple[str, Optional[str]], Any] = {}  # (path, revision) -> the one frozen copy
    adapted: dict[tuple[str, Optional[str]], list[str]] = {}  # its components holding adapters
    student_arch = None
    for i, t in enumerate(blocks):
        where = f"{key}[{i}]"
        shares = t.path is None and t.lora is None and cfg.model.lora.enabled
        guidance = cfg.rollout.sampling_options.guidance_scale if t.guidance_scale is None else t.guidance_scale
        if shares:
            teachers.append(Teacher(t, student, guidance, cfg.rollout.sampling_options.negative_prompt, shares_student=True))
            continue
        path = cfg.model.path if t.path is None else t.path
        revision = t.revision if t.path is not None else cfg.model.revision
        base = (path, revision)
        if base not in bases:
            if student_arch is None:
                student_arch = architecture_of(cfg.model.path, cfg.model.revision, "model.path")
            arch = architecture_of(path, revision, f"{where}.path")
            if arch != student_arch:
                raise TeacherConfigError(f"{where}.path={path!r} is a {arch}, the student ({cfg.model.path!r}) a "
                                         f"{student_arch}; a teacher must be of the student's family (its architecture)")
            model_cfg = dataclasses.replace(cfg.model, path=path, revision=revision,
                                            lora=dataclasses.replace(cfg.model.lora, enabled=False))
            with torch.random.fork_rng(devices=[]):  # building a teacher leaves the run's random stream as it was
                bases[base] = build_model(model_cfg, student.device, tuple(cfg.plugins))
            bases[base].set_eval_mode()
            _check_latent_space(bases[base], student, cfg, where)
            adapted[base] = []
        model = bases[base]
        if t.lora is not None:
            landed = _load_lora(model, _lora_file(t.lora, f"{where}.lora"), f"{where}.lora", adapter=t.name)
            adapted[base] += [c for c in landed if c not in adapted[base]]
        for module in model.trainable_modules().values():  # a loaded adapter would train otherwise
            module.requires_grad_(False)
        model.set_eval_mode()
        teachers.append(Teacher(t, model, guidance, cfg.rollout.sampling_options.negative_prompt, shares_student=False,
                                adapter=None if t.lora is None else t.name))
    for teacher in teachers:
        if not teacher.shares_student:
            teacher.adapted = tuple(adapted[next(b for b, m in bases.items() if m is teacher.model)])
    return teachers


def teacher_step_means(teachers: list[Teacher], routes: list[int], micro, j: int,
                       like: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The teachers' transition means of trained step j of every sample of `micro` (a
    DiffusionBatch), flattened like the student's (`like`, `[B, D]`), and the seconds it took.
    Sample i is scored by teachers[routes[i]]."""
    start = time.perf_counter()
    out = torch.empty_like(like, dtype=torch.float32)
    for k, teacher in enumerate(teachers):
        rows = [i for i, r in enumerate(routes) if r == k]
        if not rows:
            continue
        sub = micro.select(rows) if len(rows) < len(routes) else micro
        x, x_next = sub.step_latents(j)
        device = teacher.model.device
        velocity = teacher.velocity(x, sub.sigmas[:, j], sub)
        _check_velocity(teacher, velocity, x, sub, j)
        with torch.no_grad():
            step = step_latents(
                get_step_kernel(sub.kernel), model_output=velocity, sigma=sub.sigmas[:, j],
                sigma_next=sub.sigmas_next[:, j], sample=ls.to(x, device), noise_level=sub.noise_levels[:, j],
                prev_sample=ls.to(x_next, device), validate=False,  # the family's check_steps did
            )
        mean = step.mean if isinstance(step.mean, torch.Tensor) else ls.flat(step.mean)
        out[torch.as_tensor(rows, device=out.device)] = mean.to(out.device, torch.float32).reshape(len(rows), *out.shape[1:])
    return out, time.perf_counter() - start


def _check_velocity(teacher: Teacher, velocity, x, sub, j: int) -> None:
    got, want = ls.shape_of(velocity), ls.shape_of(x)
    if got != want:
        raise TeacherOutputError(f"teacher {teacher.name!r}: its velocity at trained step {j} has shape {got}, the "
                                 f"student's latents {want}; a teacher must predict in the student's latent space")
    flat = velocity if isinstance(velocity, torch.Tensor) else ls.flat(velocity)
    finite = torch.isfinite(flat.reshape(flat.shape[0], -1)).all(dim=1)
    if not bool(finite.all()):
        i = int((~finite).nonzero()[0])
        raise TeacherOutputError(f"teacher {teacher.name!r}: its velocity for sample {i} ({sub.prompts[i][:40]!r}) at "
                                 f"trained step {j} is not finite; check the teacher's weights and guidance_scale "
                                 f"({teacher.guidance_scale})")

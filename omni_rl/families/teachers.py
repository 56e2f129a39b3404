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

Where a teacher runs is its `placement`. A colocated one is built in the trainer's process (each
Ray rank builds its own) on the student's device; on FSDP2 ranks it is sharded like the actor
(`shard_teacher`), and since its forward is then a collective it runs on every micro-batch, on all
of it, in step with the other ranks. Colocated teachers of one base (the same `path` and
`revision`) share one frozen copy of it: each LoRA is loaded onto it as an adapter named after its
teacher, and a teacher's forward runs with its own adapter alone (a teacher without `lora` with
none), so two LoRA teachers of SD3.5 hold one transformer, not two. A pooled one
(`placement: pool`) runs in Ray actors of its own that the driver starts
(`omni_rl.workers.teacher_pool`); `PooledTeacher` reaches them by name and has a colocated
teacher's interface, so the loss code does not know where a teacher runs.

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
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch.distributed.tensor import DTensor

from omni_rl.algos import latent_streams as ls
from omni_rl.algos.flow_sde import get_step_kernel, step_latents
from omni_rl.option import ComponentOptions, option
from omni_rl.utils.shards import split_evenly
from omni_rl.errors import OmniConfigError, OmniRunError
from omni_rl.models.factory import build_model
from omni_rl.models.loading import pipeline_index, resolve_model_path

LORA_FILES = ("pytorch_lora_weights.safetensors",)
# Where a teacher runs (TeacherOptions.placement).
PLACEMENTS = ("colocated", "pool")


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
    placement: str = option("colocated", "colocated: beside the student (in the trainer's process, or on each Ray rank, "
                                         "sharded with FSDP2 where the student is); pool: Ray actors of its own, each "
                                         "on a device of its own, that score the stored trajectories sent to them.")
    pool_workers: int = option(1, "placement=pool: its actors, each a whole copy on one device (a GPU / NPU; a CPU "
                                  "on a CPU machine); a micro-batch's rows are split among them.")
    pool_timeout_s: float = option(600.0, "placement=pool: a call to its actors that takes longer fails the run "
                                          "naming the teacher and the actor, instead of hanging.")

    def check(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"name={self.name!r}: expected a non-empty name without '/' (it names metrics)")
        if self.guidance_scale is not None and not self.guidance_scale >= 0:
            raise ValueError(f"guidance_scale={self.guidance_scale!r}: expected >= 0 (1 = no guidance), or null for "
                             f"the student's rollout.sampling_options.guidance_scale")
        if not self.metadata_key:
            raise ValueError("metadata_key='': expected the name of a metadata field (data_source)")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement={self.placement!r}: expected one of {', '.join(PLACEMENTS)}")
        if not (isinstance(self.pool_workers, int) and self.pool_workers >= 1):
            raise ValueError(f"pool_workers={self.pool_workers!r}: expected an integer >= 1 (actors of its pool)")
        if not (self.pool_timeout_s > 0 and math.isfinite(self.pool_timeout_s)):
            raise ValueError(f"pool_timeout_s={self.pool_timeout_s!r}: expected > 0 seconds")

    @property
    def pooled(self) -> bool:
        return self.placement == "pool"


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


def pooled_teachers(cfg) -> list[TeacherOptions]:
    """The run's teachers with `placement: pool` (their Ray actors are started by the driver)."""
    return [t for t in teachers_of(cfg.algo.family_options) if t.pooled]


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
        # Sharded with FSDP2 across the Ray ranks (`shard_teacher`, or the engine's sharding of the
        # student's own base): its forward is a collective.
        self.sharded = False
        self._encoded: tuple[tuple[str, ...], Any] | None = None

    @property
    def device(self) -> torch.device:
        return self.model.device

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
    def velocity(self, latents, sigma: torch.Tensor, prompts: list[str], conditioning=None):
        """Its velocity at the samples' states: with the student's own encoding of the prompts
        (`conditioning`) where it is the student's model (the same text encoders), else its own."""
        cond = conditioning if self.shares_student else self.conditioning(prompts)
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
                # A sharded teacher's own shard (to_local): each rank checks what it holds.
                local = state[name].to_local() if isinstance(state[name], DTensor) else state[name]
                tensor = local.detach().to("cpu").contiguous().reshape(-1)
                digest.update(f"{component}.{name}:{tensor.dtype}:{tuple(state[name].shape)}".encode())
                digest.update(tensor.view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()


class TeacherPoolError(OmniRunError):
    """A teacher's pool actor that died, did not answer in time, or is not running."""


def pool_actor_name(cfg, teacher: str, index: int) -> str:
    """The Ray name of actor `index` of a teacher's pool: the driver starts it under this name
    (`omni_rl.workers.teacher_pool`), each training process finds it by it. The run's output folder
    tells two runs on one cluster apart."""
    run = hashlib.sha1(str(cfg.trainer.output_dir).encode()).hexdigest()[:12]
    return f"omni_rl.teacher.{run}.{teacher}.{index}"


def pool_actors(cfg, t: TeacherOptions) -> list:
    """Handles to the actors of teacher `t`'s pool (started by the driver before the trainer's
    processes build their families)."""
    import ray

    actors = []
    for i in range(t.pool_workers):
        name = pool_actor_name(cfg, t.name, i)
        try:
            actors.append(ray.get_actor(name))
        except ValueError:
            raise TeacherPoolError(f"teacher {t.name!r} (placement=pool): its actor {name!r} is not running; the "
                                   f"trainer starts a teacher's pool before building the student "
                                   f"(omni_rl.workers.teacher_pool.TeacherPools)") from None
    return actors


def split_rows(n: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) row ranges of n rows over at most `parts` actors, none empty, sizes within one."""
    return split_evenly(n, max(1, min(parts, n)))


class PoolClient:
    """Calls to one teacher's pool actors, each failure one line naming the teacher and the actor."""

    def __init__(self, options: TeacherOptions, actors: list):
        self.options, self.name, self.actors = options, options.name, actors
        self.timeout_s = options.pool_timeout_s
        self.infos = [{"node": "?", "pid": "?"} for _ in actors]  # until they answer
        self.infos = self.get([a.info.remote() for a in actors], "start")

    def describe(self, i: int) -> str:
        info = self.infos[i]
        return f"teacher {self.name!r}: pool actor {i} (node {info['node']}, pid {info['pid']})"

    def get(self, refs: list, what: str) -> list:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        out = []
        for i, ref in enumerate(refs):
            try:
                out.append(ray.get(ref, timeout=self.timeout_s))
            except GetTimeoutError:
                raise TeacherPoolError(f"{self.describe(i)} did not {what} within {self.timeout_s:.0f} s "
                                       f"(pool_timeout_s of algo.family_options.teachers)") from None
            except RayActorError as err:
                # Its last line names the cause where the actor raised (a failed build, say).
                cause = next((line.strip() for line in reversed(str(err).splitlines()) if line.strip()), "")
                raise TeacherPoolError(f"{self.describe(i)} died during {what} ({type(err).__name__}: {cause[:300]}); "
                                       f"check its device's memory and the worker's log") from None
        return out

    def scatter(self, method: str, n: int, args_of) -> list:
        """Rows [0, n) split among the actors: `method` of each on `args_of(lo, hi)`, in row order."""
        bounds = split_rows(n, len(self.actors))
        refs = [getattr(self.actors[k], method).remote(*args_of(lo, hi)) for k, (lo, hi) in enumerate(bounds)]
        return self.get(refs, method)


class PooledTeacher:
    """A diffusion teacher on Ray actors of its own (`placement: pool`), with `Teacher`'s interface:
    the stored states go to the actors on the host, a micro-batch's rows split among them; the
    velocities come back to the student's device and are checked there like a colocated one's."""

    shares_student = False
    sharded = False

    def __init__(self, options: TeacherOptions, guidance_scale: float, device: torch.device, actors: list):
        self.options, self.name, self.guidance_scale, self.device = options, options.name, guidance_scale, device
        self.pool = PoolClient(options, actors)

    def latent_probe(self, rollout) -> tuple[Any, torch.Tensor]:
        return self.pool.get([self.pool.actors[0].latent_probe.remote(rollout)], "decode a latent")[0]

    def velocity(self, latents, sigma: torch.Tensor, prompts: list[str], conditioning=None):
        host, sigma = ls.to(latents, "cpu"), sigma.detach().to("cpu")
        parts = self.pool.scatter("velocity", len(prompts), lambda lo, hi: (
            ls.select(host, torch.arange(lo, hi)), sigma[lo:hi], list(prompts[lo:hi])))
        return ls.to(ls.cat(parts), self.device)

    def checksum(self) -> str:
        """The teacher's checksum as its first actor holds it (every actor builds the same)."""
        return self.pool.get([self.pool.actors[0].checksum.remote()], "checksum")[0]


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


def teacher_lora_file(lora: str, key: str) -> Path:
    path = Path(lora).expanduser()
    if path.is_dir():
        path = path / LORA_FILES[0]
    if not path.is_file():
        raise TeacherConfigError(f"{key}={lora!r}: no LoRA there; expected a diffusers LoRA ({LORA_FILES[0]}), as a "
                                 f"run exports it in OUTPUT/lora, or its folder")
    return path


def load_teacher_lora(model, file: Path, key: str, adapter: str) -> list[str]:
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


def latent_probe(model, rollout) -> tuple[Any, torch.Tensor]:
    """The model's latent shape at the rollout's geometry, and its decoding of one seeded latent
    (on the host): what `check_latent_space` compares, wherever the teacher runs."""
    r = rollout.sampling_options
    shape = model.latent_shape(r.height, r.width, r.num_frames)
    batched = {k: (1, *v) for k, v in shape.items()} if isinstance(shape, dict) else (1, *shape)
    z = ls.randn(batched, generator=torch.Generator().manual_seed(0))
    return shape, model.decode(ls.to(z, model.device)).detach().to("cpu", torch.float32)


def check_latent_space(teacher_probe, student_probe, cfg, key: str) -> None:
    """A teacher's latent space is the student's: the same latent shape, and one latent decoded
    by both gives the same pixels (`latent_probe` of each)."""
    r = cfg.rollout.sampling_options
    (shape, a), (mine, b) = teacher_probe, student_probe
    if shape != mine:
        raise TeacherConfigError(f"{key}: the teacher's latent at {r.height}x{r.width} is {tuple(shape)}, the "
                                 f"student's {tuple(mine)}; a teacher must share the student's latent space")
    # The same shape is not the same space: one latent, decoded by both, must give the same pixels.
    if a.shape != b.shape or (a - b).abs().mean().item() > 1.0:
        raise TeacherConfigError(f"{key}: the teacher's decoder turns one latent into other pixels than the "
                                 f"student's; a teacher must share the student's latent space (its VAE)")


def check_architecture(cfg, path: str, revision: Optional[str], key: str) -> None:
    """The teacher at `path` is of the student's architecture (one line otherwise)."""
    mine, theirs = architecture_of(cfg.model.path, cfg.model.revision, "model.path"), architecture_of(path, revision, key)
    if mine != theirs:
        raise TeacherConfigError(f"{key}={path!r} is a {theirs}, the student ({cfg.model.path!r}) a {mine}; a teacher "
                                 f"must be of the student's family (its architecture)")


def teacher_source(cfg, t: TeacherOptions) -> tuple[str, Optional[str]]:
    """(path, revision) of a teacher's base: its own, else the student's."""
    return (cfg.model.path, cfg.model.revision) if t.path is None else (t.path, t.revision)


def shares_student(cfg, t: TeacherOptions) -> bool:
    """A diffusion teacher that is the student's own base (no `path`, no `lora`, LoRA training):
    it runs on the student's model with the adapters off and holds no weights of its own."""
    return t.path is None and t.lora is None and cfg.model.lora.enabled


def teacher_guidance(cfg, t: TeacherOptions) -> float:
    """A diffusion teacher's CFG scale: its own, else the student's."""
    return cfg.rollout.sampling_options.guidance_scale if t.guidance_scale is None else t.guidance_scale


def build_frozen(cfg, path: str, revision: Optional[str], device: torch.device):
    """A teacher's base built on `device` without LoRA, in eval mode, its parameters frozen; the
    run's random stream left as it was (a teacher's build draws nothing of the student's)."""
    model_cfg = dataclasses.replace(cfg.model, path=path, revision=revision,
                                    lora=dataclasses.replace(cfg.model.lora, enabled=False))
    with torch.random.fork_rng(devices=[]):
        model = build_model(model_cfg, device, tuple(cfg.plugins))
    freeze(model)
    return model


def freeze(model) -> None:
    for module in model.trainable_modules().values():  # a loaded adapter would train otherwise
        module.requires_grad_(False)
    model.set_eval_mode()


def shards_teachers(cfg) -> bool:
    """Colocated teachers are sharded where the student is: FSDP2 ranks in a process group."""
    import torch.distributed as dist

    return cfg.trainer.engine == "fsdp2" and dist.is_available() and dist.is_initialized()


def shard_teacher(model) -> None:
    """Shard a frozen teacher's denoiser(s) across the process group as the engine shards the
    actor (`fully_shard` per block, then the root): each rank holds 1/world of its weights and
    all-gathers a block for its forward. No mixed precision: the teacher computes in its dtype."""
    from torch.distributed.fsdp import OffloadPolicy

    from omni_rl.engine.fsdp2 import shard_model

    shard_model(model.trainable_root(), tuple(model.fsdp_wrap_classes()), None, OffloadPolicy())


def build_teachers(cfg, student, blocks: list[TeacherOptions], key: str = "algo.family_options.teachers") -> list:
    """Each teacher, frozen and checked to fit the student: colocated ones built beside it (on
    its device; sharded on FSDP2 ranks), pooled ones reached on their Ray actors."""
    teachers: list = []
    bases: dict[tuple[str, Optional[str]], Any] = {}  # (path, revision) -> the one frozen copy
    adapted: dict[tuple[str, Optional[str]], list[str]] = {}  # its components holding adapters
    student_probe = None
    for i, t in enumerate(blocks):
        where = f"{key}[{i}]"
        guidance = teacher_guidance(cfg, t)
        if t.pooled:
            # What can be checked here is, before the actors are asked (they raise in their own logs).
            if t.path is not None:
                check_architecture(cfg, t.path, t.revision, f"{where}.path")
            if t.lora is not None:
                teacher_lora_file(t.lora, f"{where}.lora")
            pooled = PooledTeacher(t, guidance, student.device, pool_actors(cfg, t))
            student_probe = student_probe or latent_probe(student, cfg.rollout)
            check_latent_space(pooled.latent_probe(cfg.rollout), student_probe, cfg, where)
            teachers.append(pooled)
            continue
        if shares_student(cfg, t):
            teachers.append(Teacher(t, student, guidance, cfg.rollout.sampling_options.negative_prompt, shares_student=True))
            continue
        base = teacher_source(cfg, t)
        if base not in bases:
            check_architecture(cfg, *base, f"{where}.path")
            bases[base] = build_frozen(cfg, *base, student.device)
            student_probe = student_probe or latent_probe(student, cfg.rollout)
            check_latent_space(latent_probe(bases[base], cfg.rollout), student_probe, cfg, where)
            adapted[base] = []
        model = bases[base]
        if t.lora is not None:
            file = teacher_lora_file(t.lora, f"{where}.lora")
            landed = load_teacher_lora(model, file, f"{where}.lora", adapter=t.name)
            adapted[base] += [c for c in landed if c not in adapted[base]]
        freeze(model)
        teachers.append(Teacher(t, model, guidance, cfg.rollout.sampling_options.negative_prompt, shares_student=False,
                                adapter=None if t.lora is None else t.name))
    sharded = shards_teachers(cfg)
    if sharded:
        for model in bases.values():
            shard_teacher(model)
    for teacher in teachers:
        if isinstance(teacher, Teacher):
            # The student's own base is sharded by the engine: its forward is a collective too.
            teacher.sharded = sharded
        if isinstance(teacher, Teacher) and not teacher.shares_student:
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
        if teacher.sharded:
            # Its forward all-gathers across the ranks, whose micro-batches route differently:
            # it runs on every micro-batch, on all of it, in step with the others; its rows are kept.
            x_all, _ = micro.step_latents(j)
            velocity_all = teacher.velocity(x_all, micro.sigmas[:, j], micro.prompts, micro.conditioning)
            if not rows:
                continue
            velocity = ls.select(velocity_all, torch.as_tensor(rows, device=ls.flat(velocity_all).device))
        elif not rows:
            continue
        sub = micro.select(rows) if len(rows) < len(routes) else micro
        x, x_next = sub.step_latents(j)
        device = teacher.device
        if not teacher.sharded:
            velocity = teacher.velocity(x, sub.sigmas[:, j], sub.prompts, sub.conditioning)
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

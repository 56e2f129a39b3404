"""The shared test suite of diffusion adapters: a new adapter gets all of it by declaring its tiny model.

An adapter's test module declares an `AdapterCase` (its registered name, its `tiny:` model, a
geometry, and how to run and LoRA-load its own diffusers pipeline) and subclasses
`DiffusionAdapterSuite` with it. Every adapter then has to show, on its tiny model loaded
through its own loading code:

1. noise 0: the native engine's ODE rollout equals the model's own diffusers pipeline on the
   same components, prompt (and source image, for an editing model) and initial latents (1e-5
   in fp32);
2. a sample is the same alone and packed: in the engine with other prompts (of other lengths,
   with other source images), and in one forward with samples at sigmas spread over the whole schedule (so a batch
   straddles any expert boundary);
3. the trainer's replay of a rollout gives the rollout's log-probs (<= 1e-5), with the old
   transition means where a loss reads them;
4. a LoRA export loads through the pipeline's own loader and the pipeline then reproduces the
   trained adapter's ODE sample (and not the base model's);
5. the weightless (meta) build has the loaded model's trainable tensors and latent shapes;
6. compiled (`model.compile_options`, inductor, regional) its forward equals the eager one within
   the case's `compile_atol` (fp32), on a batch across the schedule with CFG: under the `long`
   marker, since inductor's code generation takes tens of seconds per model on a CPU (the default
   run checks the compiled wiring with `aot_eager` on the demo's model: tests/omni_rl/models/test_compile.py).

Latents may be plain tensors or `LatentStreams` (LTX-2's video + audio): the suite handles both
through `omni_rl.algos.latent_streams` and compares streams one by one.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar

import pytest
import torch

from omni_rl.algos import latent_streams as ls
from omni_rl.compose import load_config
from omni_rl.config.schema import LoraConfig, ModelConfig
from omni_rl.data.diffusion_batch import DiffusionBatch
from omni_rl.device import weightless_device
from omni_rl.families.diffusion import DiffusionFamily
from omni_rl.models import build_model
from omni_rl.models.loading import resolve_model_path
from omni_rl.models.registry import ADAPTERS, adapter_key
from omni_rl.plugins import load_plugins
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.types import DiffusionRequest

TIMEOUT_S = 900.0
PROMPTS = ("a red cube", "a very small green sphere on a long wooden table", "fog")


@dataclass
class AdapterCase:
    adapter: str
    tiny: str
    height: int
    width: int
    num_frames: int = 1
    fps: float = 16.0
    steps: int = 4
    guidance: float = 3.0
    model_options: dict[str, Any] = field(default_factory=dict)
    # (model, fresh: bool) -> a diffusers pipeline on the model's components (fresh: loaded from
    # the model folder anew, with the adapter's Euler schedule), ready to run.
    pipeline: Callable[[Any, bool], Any] = None
    # (pipeline, prompt, initial latents [1, ...], steps, guidance, case) -> clean latents [1, ...]
    # (for a multi-stream model both are `LatentStreams` in the adapter's latent space).
    pipeline_latents: Callable[..., torch.Tensor] = None
    # (pipeline, folder) -> None: the pipeline's own LoRA loader on an exported folder.
    load_lora: Callable[[Any, str], None] = None
    atol: float = 1e-5
    # Editing models: prompt -> its source image (PIL; each prompt its own), and the model
    # options under which the adapter encodes it as the pipeline does (tests 1 and 4).
    source_image: Callable[[str], Any] = None
    pipeline_options: dict[str, Any] = field(default_factory=dict)
    # Compiled (inductor) against eager forward, fp32: max |delta| of the velocity (test 6;
    # benchmarks/compile.py --numerics measures it per model).
    compile_atol: float = 1e-4


def model_config(**values) -> ModelConfig:
    """A `ModelConfig` from keyword values: the schema's own fields as given, every other key (an
    adapter's option: `stg_scale`, `cfg_interval`, ...) into `adapter_options`, the adapter's options
    instance (what `omni_rl.compose` makes of a recipe's block)."""
    schema = {f.name for f in fields(ModelConfig)}
    cfg = ModelConfig(**{k: v for k, v in values.items() if k in schema})
    cfg.adapter_options = adapter_options(cfg, **{k: v for k, v in values.items() if k not in schema})
    return cfg


def adapter_options(cfg: ModelConfig, **options):
    """The options instance of `cfg`'s adapter with these values (the rest its defaults)."""
    load_plugins(())
    return ADAPTERS.get(adapter_key(cfg.adapter, cfg.stage)).options_class(**options)


def build(case: AdapterCase, device: torch.device | None = None, path: str | None = None, **changes):
    cfg = model_config(adapter=case.adapter, path=path or f"tiny:{case.tiny}", **{**case.model_options, **changes})
    return build_model(cfg, device or torch.device("cpu"))


def condition(case: AdapterCase, model, prompt: str):
    """The request's condition images for `prompt` (None for a text-to-image model)."""
    if case.source_image is None:
        return None
    return model.condition_images([case.source_image(prompt)], case.height, case.width)


def encode(case: AdapterCase, model, prompts: list[str]):
    images = None if case.source_image is None else [condition(case, model, p) for p in prompts]
    return model.encode_prompts(prompts) if images is None else model.encode_prompts(prompts, images=images)


def request(case: AdapterCase, prompt: str, seed: int, model=None, **changes) -> DiffusionRequest:
    if model is not None:
        changes.setdefault("images", condition(case, model, prompt))
    fields = dict(prompt=prompt, seed=seed, height=case.height, width=case.width, num_frames=case.num_frames,
                  fps=case.fps,
                  num_steps=case.steps, guidance_scale=case.guidance, kernel="sde", noise_level=0.7,
                  sde_window_size=2, sde_window_range=(0, case.steps))
    fields.update(changes)
    return DiffusionRequest(**fields)


def ode(case: AdapterCase, prompt: str, noise: torch.Tensor, model=None) -> DiffusionRequest:
    return request(case, prompt, seed=0, model=model, kernel="ode", noise_level=0.0, sde_window_size=0, sde_window_range=None,
                   initial_noise=noise)


def generate(model, requests, max_num_seqs: int, driver: str = "thread"):
    engine = NativeDiffusionEngine(model, max_num_seqs=max_num_seqs, driver=driver)
    try:
        return engine.generate(requests, timeout_s=TIMEOUT_S), dict(engine.stats)
    finally:
        engine.close()


def initial_noise(model, case: AdapterCase, seed: int):
    shape = model.latent_shape(case.height, case.width, case.num_frames)
    return ls.randn(shape, generator=torch.Generator().manual_seed(seed))


def assert_latents_close(actual, expected, atol: float, msg: str = "") -> None:
    """`torch.testing.assert_close` of plain latents, or of each stream of `LatentStreams`."""
    if not isinstance(expected, ls.LatentStreams):
        torch.testing.assert_close(actual, expected, atol=atol, rtol=0, msg=msg or None)
        return
    assert isinstance(actual, ls.LatentStreams) and actual.names == expected.names, (ls.shape_of(actual), expected.names)
    for name in expected.names:
        torch.testing.assert_close(actual[name], expected[name], atol=atol, rtol=0, msg=f"{msg} stream {name!r}".strip())


def max_change(a, b) -> float:
    """The largest absolute difference over every stream (each stream must move: the smallest
    stream's largest change)."""
    if isinstance(a, ls.LatentStreams):
        return min(float((a[n].float() - b[n].float()).abs().max()) for n in a.names)
    return float((a.float() - b.float()).abs().max())


def one(x):
    """A batch of one: [1, ...]."""
    return ls.stack([x])


@torch.no_grad()
def assert_alone_equals_packed_across_the_schedule(model, case: AdapterCase, atol: float) -> None:
    """One forward over samples at every sigma of an 8-step schedule (high to low noise, so any
    expert boundary is straddled) with prompts of different lengths equals each sample alone."""
    sigmas = model.sigmas(8, case.height, case.width, case.num_frames)[:-1]
    n = len(sigmas)
    x = ls.stack([initial_noise(model, case, seed=s) for s in range(n)])
    cond = encode(case, model, [PROMPTS[i % len(PROMPTS)] for i in range(n)])
    together = model.predict_velocity(x, sigmas, cond, case.guidance)
    for i in range(n):
        row = torch.tensor([i])
        alone = model.predict_velocity(ls.select(x, row), sigmas[i : i + 1], cond.select([i]), case.guidance)
        assert_latents_close(ls.select(together, row), alone, atol=atol, msg=f"sample {i}")


class DiffusionAdapterSuite:
    case: ClassVar[AdapterCase]

    @pytest.fixture(scope="class")
    @classmethod
    def model(cls):
        return build(cls.case)

    # 1 ---------------------------------------------------------------------------------------
    def test_noise_zero_rollout_equals_the_pipeline(self, model):
        case = self.case
        if case.pipeline_options:
            model = build(case, **case.pipeline_options)
        noise = initial_noise(model, case, seed=7)
        (ours,), _ = generate(model, [ode(case, PROMPTS[1], noise, model)], max_num_seqs=1)
        theirs = case.pipeline_latents(case.pipeline(model, False), PROMPTS[1], one(noise), case.steps,
                                       case.guidance, case)
        assert_latents_close(ours.final_latent, ls.to(ls.index(theirs, 0), dtype=torch.float32), atol=case.atol)
        assert max_change(ours.final_latent, noise) > 1e-2  # the sampler moved the latent (every stream)
        assert ours.image is not None and ours.image.dtype == torch.uint8

    # 2 ---------------------------------------------------------------------------------------
    def test_a_sample_is_the_same_alone_and_packed_in_the_engine(self, model):
        case = self.case
        target = request(case, PROMPTS[0], seed=11, model=model)
        (alone,), _ = generate(model, [target], max_num_seqs=1)
        mates = [request(case, p, seed=20 + i, model=model) for i, p in enumerate(PROMPTS[1:])]
        packed, stats = generate(model, [*mates, request(case, PROMPTS[0], seed=11, model=model)],
                                 max_num_seqs=len(mates) + 1)
        assert stats["forward_batch_sum"] == (len(mates) + 1) * case.steps  # all packed in every forward
        got = packed[-1]
        assert_latents_close(got.latents, alone.latents, atol=case.atol)
        torch.testing.assert_close(got.log_probs, alone.log_probs, atol=case.atol, rtol=0)
        assert max_change(packed[0].final_latent, got.final_latent) > 1e-3

    def test_a_sample_is_the_same_alone_and_in_a_forward_across_the_schedule(self, model):
        assert_alone_equals_packed_across_the_schedule(model, self.case, atol=self.case.atol)

    # 3 ---------------------------------------------------------------------------------------
    @pytest.mark.parametrize("loss", ["flow_grpo", "flow_dppo"])
    def test_the_trainer_replays_the_rollout_log_probs(self, model, loss):
        case = self.case
        # A reward that scores what the model makes (the config refuses an image reward on video).
        reward = "video_brightness" if case.num_frames > 1 else "brightness"
        cfg = load_config([f"model.adapter={case.adapter}", f"model.path=tiny:{case.tiny}",
                           f"algo.policy_loss={loss}", f"rollout.sampling_options.num_frames={case.num_frames}",
                           f"rollout.sampling_options.fps={case.fps}", f"rollout.sampling_options.height={case.height}", f"rollout.sampling_options.width={case.width}",
                           f"rollout.sampling_options.guidance_scale={case.guidance}",
                           "rollout.sampling_options.sde_window_range=null", f"reward.rewards=[{{name: {reward}}}]"])
        family = DiffusionFamily(cfg, model)
        results, _ = generate(model, [request(case, p, seed=i, model=model) for i, p in enumerate(PROMPTS)],
                              max_num_seqs=3)
        batch = DiffusionBatch.from_results(results, [{}] * len(results), [0] * len(results))
        policy = family.behaviour_policy(batch, micro_batch_size=2)
        torch.testing.assert_close(policy.log_probs, batch.rollout_log_probs, atol=1e-5, rtol=0)
        assert (policy.means is not None) == (loss == "flow_dppo")

    # 4 ---------------------------------------------------------------------------------------
    def test_the_lora_export_loads_through_the_pipeline_and_reproduces_the_adapter(self, tmp_path):
        case = self.case
        trained = build(self.case, lora=LoraConfig(enabled=True, rank=4, alpha=8), **case.pipeline_options)
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for name, p in trained.trainable_root().named_parameters():
                if p.requires_grad:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        trained.save_lora(str(tmp_path / "lora"))
        noise = initial_noise(trained, case, seed=5)
        (ours,), _ = generate(trained, [ode(case, PROMPTS[0], noise, trained)], max_num_seqs=1)

        base = case.pipeline(trained, True)
        before = case.pipeline_latents(base, PROMPTS[0], one(noise), case.steps, case.guidance, case)
        case.load_lora(base, str(tmp_path / "lora"))
        after = case.pipeline_latents(base, PROMPTS[0], one(noise), case.steps, case.guidance, case)
        assert_latents_close(ls.to(ls.index(after, 0), dtype=torch.float32), ours.final_latent, atol=1e-4)
        assert max_change(after, before) > 1e-3  # the LoRA changed the pipeline's output

    # 5 ---------------------------------------------------------------------------------------
    def test_the_weightless_build_has_the_loaded_architecture(self, tmp_path, model):
        case = self.case
        copy = tmp_path / "no_weights"
        shutil.copytree(resolve_model_path(f"tiny:{case.tiny}"), copy)
        for f in [*copy.rglob("*.safetensors"), *copy.rglob("*.bin")]:
            f.unlink()
        view = build(case, weightless_device(), path=str(copy))
        assert view.weightless
        names = lambda m: {n: tuple(t.shape) for n, t in m.named_trainable_tensors().items()}  # noqa: E731
        assert names(view) == names(model)
        geometry = (case.height, case.width, case.num_frames)
        assert view.latent_shape(*geometry) == model.latent_shape(*geometry)
        torch.testing.assert_close(view.sigmas(6, *geometry), model.sigmas(6, *geometry), rtol=0, atol=0)
        for module in [*view.trainable_modules().values(), *view.frozen_modules()]:
            assert all(p.is_meta for p in module.parameters())

    # 6 ---------------------------------------------------------------------------------------
    @pytest.mark.long
    def test_the_compiled_forward_equals_the_eager_one(self):
        from omni_rl.models.compile import CompileOptions

        delta = compiled_forward_delta(self.case, CompileOptions(enabled=True, backend="inductor"))
        assert delta <= self.case.compile_atol, f"compiled vs eager max |delta| {delta:.3e} > {self.case.compile_atol:.0e}"


@torch.no_grad()
def compiled_forward_delta(case: AdapterCase, options) -> float:
    """Max |delta| of one forward (8 samples across an 8-step schedule, CFG) of the case's model
    compiled with `options` against the same model eager, fp32."""
    eager = build(case)
    compiled = build(case, compile_options=options)
    sigmas = eager.sigmas(8, case.height, case.width, case.num_frames)[:-1]
    n = len(sigmas)
    x = ls.stack([initial_noise(eager, case, seed=s) for s in range(n)])
    cond = encode(case, eager, [PROMPTS[i % len(PROMPTS)] for i in range(n)])
    want = eager.predict_velocity(x, sigmas, cond, case.guidance)
    got = compiled.predict_velocity(x, sigmas, cond, case.guidance)
    if isinstance(want, ls.LatentStreams):
        return max(float((got[k] - want[k]).abs().max()) for k in want.names)
    return float((got - want).abs().max())


def suite_cases() -> dict[str, AdapterCase]:
    """Every adapter case of the shared suite (each test module's `DiffusionAdapterSuite` classes), by class name."""
    import importlib
    from pathlib import Path

    cases = {}
    for file in sorted(Path(__file__).parent.glob("test_*_adapter.py")):
        module = importlib.import_module(f"tests.adapters.{file.stem}")
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, DiffusionAdapterSuite) and value is not DiffusionAdapterSuite:
                cases[name] = value.case
    return cases


def fresh_pipeline(pipeline_cls, model, path: str | None = None, **changes):
    """`pipeline_cls.from_pretrained` of the model's folder with the adapter's own scheduler."""
    import copy as _copy

    pipe = pipeline_cls.from_pretrained(path or model.path, scheduler=_copy.deepcopy(model.scheduler), **changes)
    pipe.set_progress_bar_config(disable=True)
    return pipe

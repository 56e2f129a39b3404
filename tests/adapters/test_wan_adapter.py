"""The Wan2.2 adapter on `tiny:wan22` (two experts) and `tiny:wan22_ti2v` (one expert, per-token
timesteps): the Euler ODE equals diffusers' WanPipeline, per-sample expert routing in packed
batches, shape errors, LoRA export both experts load into diffusers, a responsive decoder, and
the weightless build."""
import pytest
import torch

from omni_rl.models import build_model

from tests.adapters.diffusion_suite import AdapterCase, DiffusionAdapterSuite, fresh_pipeline, model_config

ADAPTER = "WanPipeline"
SEQ = 32  # text tokens; the tiny UMT5 encoder is cheap at any length, a short one keeps tests fast
HEIGHT = WIDTH = 32
FRAMES = 5


def load(name: str, device: str = "cpu", **changes):
    cfg = model_config(adapter=ADAPTER, path=f"tiny:{name}", max_sequence_length=SEQ, **changes)
    return build_model(cfg, torch.device(device))


@pytest.fixture(scope="module")
def wan22():
    return load("wan22")


@pytest.fixture(scope="module")
def ti2v():
    return load("wan22_ti2v")


def noise(model, batch: int, seed: int = 0) -> torch.Tensor:
    shape = model.latent_shape(HEIGHT, WIDTH, FRAMES)
    return torch.randn((batch, *shape), generator=torch.Generator().manual_seed(seed))


def euler_pipeline(model):
    """A WanPipeline over the adapter's own components with a fresh copy of its Euler schedule."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    p = model.pipeline
    pipe = WanPipeline(
        tokenizer=p.tokenizer, text_encoder=p.text_encoder, vae=p.vae,
        scheduler=FlowMatchEulerDiscreteScheduler.from_config(model.scheduler.config),
        transformer=p.transformer, transformer_2=p.transformer_2,
        boundary_ratio=p.config.boundary_ratio, expand_timesteps=p.config.expand_timesteps,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_layout(wan22, ti2v):
    assert list(wan22.trainable_modules()) == ["transformer", "transformer_2"]
    assert list(ti2v.trainable_modules()) == ["transformer"]
    assert isinstance(wan22.trainable_root(), torch.nn.ModuleDict) and ti2v.trainable_root() is ti2v.transformer
    with pytest.raises(NotImplementedError, match="trainable_modules"):
        wan22.trainable_module()  # two experts: no single trained module to hand out
    assert wan22.boundary_timestep == 875.0 and ti2v.boundary_timestep is None
    assert ti2v.expand_timesteps and not wan22.expand_timesteps
    # The checkpoint ships UniPC; the adapter schedules with Euler at the checkpoint's flow_shift.
    assert type(wan22.scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
    assert wan22.scheduler.config.shift == 3.0
    assert wan22.latent_shape(HEIGHT, WIDTH, FRAMES) == (16, 2, 4, 4)
    assert wan22.latent_shape(64, 48) == (16, 1, 8, 6)
    cond = wan22.encode_prompts(["a red cat", "blue sky"])
    assert cond["prompt_embeds"].shape == cond["negative_prompt_embeds"].shape == (2, SEQ, 32)
    # LoRA on both experts; the VAE and the text encoder frozen.
    assert all(any("lora" in n for n, _ in m.named_parameters()) for m in wan22.trainable_modules().values())
    assert not [p for m in wan22.frozen_modules() for p in m.parameters() if p.requires_grad]


@pytest.mark.parametrize("name, guidance_2", [("wan22", 2.0), ("wan22_ti2v", None)])
def test_euler_ode_equals_diffusers_pipeline(name, guidance_2, wan22, ti2v):
    model = {"wan22": wan22, "wan22_ti2v": ti2v}[name]
    prompts, negative, steps, guidance = ["a red cat", "a small boat at dawn"], "blurry", 6, 4.0
    sigmas = model.sigmas(steps)
    if model.transformer_2 is not None:  # the schedule crosses the boundary: both experts run
        t = sigmas[:-1] * model.num_train_timesteps
        assert (t >= model.boundary_timestep).any() and (t < model.boundary_timestep).any()
    model.options.guidance_scale_2 = guidance_2
    try:
        x0 = noise(model, len(prompts))
        cond = model.encode_prompts(prompts, negative)
        x = x0.clone()
        with torch.no_grad():
            for k in range(steps):
                v = model.predict_velocity(x, sigmas[k].expand(len(prompts)), cond, guidance)
                x = x + (sigmas[k + 1] - sigmas[k]) * v
        expected = euler_pipeline(model)(
            prompt=prompts, negative_prompt=[negative] * len(prompts), height=HEIGHT, width=WIDTH,
            num_frames=FRAMES, latents=x0.clone(), num_inference_steps=steps, guidance_scale=guidance,
            guidance_scale_2=guidance_2, output_type="latent", max_sequence_length=SEQ,
        ).frames
    finally:
        model.options.guidance_scale_2 = None
    torch.testing.assert_close(x, expected.float(), atol=1e-5, rtol=1e-5)


def test_encode_prompts_equals_pipeline(wan22):
    pos, neg = wan22.pipeline.encode_prompt(["a cat"], ["ugly"], max_sequence_length=SEQ, device="cpu")
    cond = wan22.encode_prompts(["a cat"], "ugly")
    assert torch.equal(cond["prompt_embeds"], pos) and torch.equal(cond["negative_prompt_embeds"], neg)
    # Padding beyond the prompt's tokens is zero, as the pipeline pads it.
    assert cond["prompt_embeds"][0, 10:].abs().sum() == 0


@pytest.mark.parametrize("name", ["wan22", "wan22_ti2v"])
def test_packed_batch_equals_each_sample_alone(name, wan22, ti2v):
    model = {"wan22": wan22, "wan22_ti2v": ti2v}[name]
    # 0.875 sits exactly on the boundary (timestep 875 -> the high-noise expert).
    sigma = torch.tensor([0.95, 0.3, 0.875, 0.6, 0.99])
    x = noise(model, len(sigma), seed=3)
    cond = model.encode_prompts(["one", "a second prompt", "three cats", "four", "fifth"], "bad")
    model.options.guidance_scale_2 = 2.5
    try:
        with torch.no_grad():
            packed = model.predict_velocity(x, sigma, cond, 4.0)
            for i in range(len(sigma)):
                alone = model.predict_velocity(x[i : i + 1], sigma[i : i + 1], cond.select([i]), 4.0)
                torch.testing.assert_close(packed[i : i + 1], alone, atol=1e-5, rtol=1e-5)
    finally:
        model.options.guidance_scale_2 = None
    assert packed.dtype == torch.float32 and packed.shape == x.shape


def test_each_sample_goes_to_the_expert_of_its_own_sigma(wan22):
    # Low first, so a batch-order mix-up would show; 0.875 is the boundary itself (timestep 875
    # >= boundary_ratio * 1000: the high-noise expert, as in WanPipeline).
    sigma = torch.tensor([0.3, 0.95, 0.875])
    x = noise(wan22, 3, seed=4)
    cond = wan22.encode_prompts(["low noise", "high noise", "on the boundary"])
    with torch.no_grad():
        packed = wan22.predict_velocity(x, sigma, cond, 4.0)
        t = sigma * 1000
        expected = [
            wan22._guided(expert, x[i : i + 1], t[i : i + 1], cond.select([i]), 4.0)  # guidance_scale_2 = 4.0
            for i, expert in enumerate((wan22.transformer_2, wan22.transformer, wan22.transformer))
        ]
        wrong = wan22._guided(wan22.transformer, x[:1], t[:1], cond.select([0]), 4.0)
    torch.testing.assert_close(packed, torch.cat(expected), atol=1e-5, rtol=1e-5)
    assert (packed[:1] - wrong).abs().max() > 1e-3


def test_gradients_reach_both_experts_through_a_straddling_batch(wan22):
    x = noise(wan22, 2, seed=6)
    cond = wan22.encode_prompts(["high", "low"])
    v = wan22.predict_velocity(x, torch.tensor([0.95, 0.2]), cond, 4.0)
    v.square().mean().backward()
    try:
        for name, module in wan22.trainable_modules().items():
            grads = [p.grad for p in module.parameters() if p.requires_grad]
            assert any(g is not None and g.abs().sum() > 0 for g in grads), f"no gradient reached {name}"
    finally:
        for p in wan22.trainable_parameters():
            p.grad = None


def test_bad_sizes_and_frame_counts_name_the_valid_values(wan22):
    with pytest.raises(ValueError, match=r"num_frames=6 .*4k\+1.* 5 and 9"):
        wan22.latent_shape(32, 32, 6)
    with pytest.raises(ValueError, match=r"num_frames=0 .* 1 and 5"):
        wan22.latent_shape(32, 32, 0)
    with pytest.raises(ValueError, match=r"height=40 px is not a multiple of 16.* 32 and 48"):
        wan22.latent_shape(40, 32, 5)
    with pytest.raises(ValueError, match=r"width=8 px is not a multiple of 16.* 16"):
        wan22.latent_shape(32, 8, 5)


def test_lora_export_loads_into_diffusers_for_both_experts(tmp_path):
    from diffusers import WanPipeline

    model = load("wan22")  # a model of its own: its LoRA weights are changed here
    assert model.cfg.lora.enabled and model.cfg.lora.alpha != model.cfg.lora.rank  # the scale must travel
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_trainable_tensors().items():
            assert name.startswith(("transformer.", "transformer_2.")) and "lora" in name
        for p in model.trainable_parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    model.save_lora(str(tmp_path))

    pipe = WanPipeline.from_pretrained(model.path)
    pipe.load_lora_weights(str(tmp_path))
    pipe.load_lora_weights(
        str(tmp_path), weight_name="pytorch_lora_weights_transformer_2.safetensors", load_into_transformer_2=True
    )
    x = noise(model, 1, seed=5)
    t = torch.tensor([500.0])
    embeds = model.encode_prompts(["a lora test"])["prompt_embeds"]
    with torch.no_grad():
        for name in ("transformer", "transformer_2"):
            ours = getattr(model, name)(x, t, embeds, return_dict=False)[0]
            theirs = getattr(pipe, name)(x, t, embeds, return_dict=False)[0]
            with model.lora_disabled():
                base = getattr(model, name)(x, t, embeds, return_dict=False)[0]
            torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
            assert (ours - base).abs().max() > 1e-2, f"{name}: the perturbed LoRA changed nothing"


def test_weight_sync_round_trip_keeps_the_experts_apart(wan22):
    tensors = wan22.named_trainable_tensors()
    assert {n.split(".")[0] for n in tensors} == {"transformer", "transformer_2"}
    name = next(n for n in tensors if n.startswith("transformer_2."))
    before = tensors[name].clone()
    try:
        wan22.load_named_tensors({name: torch.full_like(before, 0.5)})
        assert torch.all(wan22.named_trainable_tensors()[name] == 0.5)
        twin = name.replace("transformer_2.", "transformer.", 1)
        assert not torch.all(wan22.named_trainable_tensors()[twin] == 0.5)
    finally:
        wan22.load_named_tensors({name: before})
    with pytest.raises(KeyError, match="no parameter"):
        wan22.load_named_tensors({"transformer_3.x": before})


@pytest.mark.parametrize("name", ["wan22", "wan22_ti2v"])
def test_decoder_responds_to_the_latents(name, wan22, ti2v):
    model = {"wan22": wan22, "wan22_ti2v": ti2v}[name]
    shape = model.latent_shape(HEIGHT, WIDTH, FRAMES)
    base = torch.zeros((1, *shape))
    video = model.decode(base)
    assert video.dtype == torch.uint8 and video.shape == (1, FRAMES, HEIGHT, WIDTH, 3)
    brightness = [float(model.decode(base + step).float().mean()) / 255 for step in (-0.5, 0.0, 0.5)]
    # A step of half a latent std moves the mean brightness by well over 0.05 (measured: 0.24).
    assert brightness[2] - brightness[1] >= 0.05 and brightness[1] - brightness[0] >= 0.05, brightness


@pytest.mark.parametrize("name", ["wan22", "wan22_ti2v"])
def test_weightless_build_reports_the_same_shapes(name, wan22, ti2v, tmp_path):
    import shutil

    from omni_rl.device import weightless_device

    model = {"wan22": wan22, "wan22_ti2v": ti2v}[name]
    # A copy of the model folder without a single weight file: the weightless view reads configs only.
    folder = tmp_path / "no_weights"
    shutil.copytree(model.path, folder)
    for f in [*folder.rglob("*.safetensors"), *folder.rglob("*.bin")]:
        f.unlink()
    cfg = model_config(adapter=ADAPTER, path=str(folder), max_sequence_length=SEQ)
    meta = build_model(cfg, weightless_device())
    assert meta.weightless
    assert meta.latent_shape(HEIGHT, WIDTH, FRAMES) == model.latent_shape(HEIGHT, WIDTH, FRAMES)
    assert meta.latent_shape(64, 48) == model.latent_shape(64, 48)
    assert list(meta.trainable_modules()) == list(model.trainable_modules())
    for module in [*meta.trainable_modules().values(), *meta.frozen_modules()]:
        assert all(p.is_meta for p in module.parameters())
    assert torch.equal(meta.sigmas(6), model.sigmas(6))
    assert sorted(meta.named_trainable_tensors()) == sorted(model.named_trainable_tensors())


# --- the shared diffusion adapter suite ----------------------------------------------------
def suite_pipeline(model, fresh: bool):
    from diffusers import WanPipeline

    return fresh_pipeline(WanPipeline, model) if fresh else euler_pipeline(model)


def suite_pipeline_latents(pipe, prompt, latents, steps, guidance, case):
    return pipe(prompt=prompt, negative_prompt="", height=case.height, width=case.width, num_frames=case.num_frames,
                latents=latents, num_inference_steps=steps, guidance_scale=guidance, output_type="latent",
                max_sequence_length=SEQ).frames


def suite_load_lora(pipe, folder):
    pipe.load_lora_weights(folder)
    if pipe.transformer_2 is not None:
        pipe.load_lora_weights(folder, weight_name="pytorch_lora_weights_transformer_2.safetensors",
                               load_into_transformer_2=True)


def suite_case(tiny: str) -> AdapterCase:
    # 6 steps cross the two-expert model's boundary (timestep 875 at shift 3).
    return AdapterCase(adapter=ADAPTER, tiny=tiny, height=HEIGHT, width=WIDTH, num_frames=FRAMES, steps=6,
                       guidance=4.0, model_options={"max_sequence_length": SEQ}, pipeline=suite_pipeline,
                       pipeline_latents=suite_pipeline_latents, load_lora=suite_load_lora)


class TestWan22OnTheSuite(DiffusionAdapterSuite):
    case = suite_case("wan22")


class TestWan22TI2VOnTheSuite(DiffusionAdapterSuite):
    case = suite_case("wan22_ti2v")

"""The HunyuanVideo-1.5 adapter on `tiny:hunyuan_video15`: the shared suite (the Euler ODE equals
diffusers' HunyuanVideo15Pipeline, alone equals packed, replay, the LoRA export through the
transformer's own loader, the weightless build), plus what is the model's own: per-sample frame
counts, the text streams as the pipeline encodes them, the glyph stream, the shift option, a
responsive decoder, and the load-time errors."""
import pytest
import torch

from omni_rl.cli import main
from omni_rl.models import build_model

from tests.adapters.diffusion_suite import (
    AdapterCase, DiffusionAdapterSuite, fresh_pipeline, generate, model_config, ode, request,
)

ADAPTER = "HunyuanVideo15Pipeline"
SEQ = 64  # Qwen text tokens; the tiny encoder is cheap at any length, a short one keeps tests fast
HEIGHT = WIDTH = 32
FRAMES = 5


def load(device: str = "cpu", **options):
    cfg = model_config(adapter=ADAPTER, path="tiny:hunyuan_video15", max_sequence_length=SEQ, **options)
    return build_model(cfg, torch.device(device))


@pytest.fixture(scope="module")
def model():
    return load()


def configure(pipe, model, guidance: float):
    """The pipeline as the adapter encodes with it (prefix counted by the tokenizer, prompt
    length), with CFG at `guidance` (the pipeline reads its scale from its guider)."""
    from diffusers import ClassifierFreeGuidance

    pipe.prompt_template_encode_start_idx = model.pipeline.prompt_template_encode_start_idx
    pipe.tokenizer_max_length = model.pipeline.tokenizer_max_length
    pipe.register_modules(guider=ClassifierFreeGuidance(guidance_scale=guidance))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def euler_pipeline(model):
    """A HunyuanVideo15Pipeline over the adapter's own components with a fresh copy of its schedule."""
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline

    p = model.pipeline
    return HunyuanVideo15Pipeline(
        text_encoder=p.text_encoder, tokenizer=p.tokenizer, transformer=p.transformer, vae=p.vae,
        scheduler=FlowMatchEulerDiscreteScheduler.from_config(model.scheduler.config),
        text_encoder_2=p.text_encoder_2, tokenizer_2=p.tokenizer_2, guider=p.guider,
    )


# --- the shared diffusion adapter suite ----------------------------------------------------
def suite_pipeline(model, fresh: bool):
    from diffusers import HunyuanVideo15Pipeline

    pipe = fresh_pipeline(HunyuanVideo15Pipeline, model) if fresh else euler_pipeline(model)
    return configure(pipe, model, guidance=1.0)


def suite_pipeline_latents(pipe, prompt, latents, steps, guidance, case):
    from diffusers import ClassifierFreeGuidance

    pipe.register_modules(guider=ClassifierFreeGuidance(guidance_scale=guidance))
    return pipe(prompt=prompt, negative_prompt="", height=case.height, width=case.width, num_frames=case.num_frames,
                latents=latents, num_inference_steps=steps, output_type="latent").frames


def suite_load_lora(pipe, folder):
    # diffusers 0.42's HunyuanVideo15Pipeline has no load_lora_weights: the transformer's own loader.
    pipe.transformer.load_lora_adapter(folder, weight_name="pytorch_lora_weights.safetensors", prefix="transformer")


class TestHunyuanVideo15OnTheSuite(DiffusionAdapterSuite):
    case = AdapterCase(adapter=ADAPTER, tiny="hunyuan_video15", height=HEIGHT, width=WIDTH, num_frames=FRAMES,
                       fps=24.0, steps=6, guidance=6.0, model_options={"max_sequence_length": SEQ},
                       pipeline=suite_pipeline, pipeline_latents=suite_pipeline_latents, load_lora=suite_load_lora)


# --- the model's own ----------------------------------------------------------------------
def test_layout(model):
    assert model.trainable_module() is model.transformer
    assert model.transformer.config.in_channels == 2 * model.vae.config.latent_channels + 1
    assert model.scheduler.config.shift == 5.0 and not model.scheduler.config.use_dynamic_shifting
    assert model.latent_shape(HEIGHT, WIDTH, FRAMES) == (8, 2, 2, 2)
    assert model.latent_shape(64, 48, 9) == (8, 3, 4, 3)
    # The prefix the pipeline drops, counted with the tiny tokenizer (the real one's is 108).
    tok = model.pipeline.tokenizer
    start = model.pipeline.prompt_template_encode_start_idx
    ids = tok.apply_chat_template([[{"role": "system", "content": model.pipeline.system_message},
                                    {"role": "user", "content": "a cat"}]], add_generation_prompt=True, tokenize=True,
                                  return_dict=True)["input_ids"][0]
    assert tok.decode(ids[start:]).startswith("a cat<|im_end|>")
    assert any("lora" in n for n, _ in model.transformer.named_parameters())
    assert not [p for m in model.frozen_modules() for p in m.parameters() if p.requires_grad]


def test_encode_prompts_equals_the_pipeline_up_to_the_padding(model):
    prompts = ["a red cat", 'a shop sign that says "OPEN" in neon']
    cond = model.encode_prompts(prompts, "blurry")
    pipe = model.pipeline
    for prefix, texts in (("", prompts), ("negative_", ["blurry", "blurry"])):
        e, m, e2, m2 = pipe.encode_prompt(prompt=texts, device="cpu", dtype=torch.float32, batch_size=len(texts))
        for name, full, mask in (("prompt_embeds", e, m), ("prompt_embeds_2", e2, m2)):
            ours, our_mask = cond[prefix + name], cond[model_mask(prefix + name)]
            n = ours.shape[1]
            assert torch.equal(ours, full[:, :n]) and torch.equal(our_mask, mask[:, :n].long())
            assert mask[:, n:].sum() == 0  # only padding was cut
    # The glyph stream: the quoted text's bytes for the second prompt, nothing for the first.
    mask_2 = cond["prompt_embeds_mask_2"]
    assert mask_2[0].sum() == 0 and mask_2[1].sum() == len('Text "OPEN". ') + 1  # + ByT5's </s>


def model_mask(name: str) -> str:
    return name.replace("prompt_embeds", "prompt_embeds_mask")


def test_padding_is_inert(model):
    """The same sample with its text streams padded further (masked) predicts the same velocity."""
    cond = model.encode_prompts(['a sign saying "hi"'])
    x = torch.randn((1, *model.latent_shape(HEIGHT, WIDTH, FRAMES)), generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.7])
    with torch.no_grad():
        short = model.predict_velocity(x, sigma, cond, 6.0)
        long = model.predict_velocity(x, sigma, cond.pad_to(cond.sequence_length("prompt_embeds") + 17), 6.0)
    torch.testing.assert_close(long, short, atol=1e-5, rtol=0)


def test_each_sample_keeps_its_own_frame_count(model):
    """Requests of 1, 5 and 9 frames in one engine: each sample's latent and video have its own
    length, and equal the same request run alone."""
    reqs = [request(TestHunyuanVideo15OnTheSuite.case, "a boat", seed=3 + i, num_frames=f, num_steps=3,
                    sde_window_range=(0, 3)) for i, f in enumerate((1, 5, 9))]
    together, _ = generate(model, reqs, max_num_seqs=3)
    for req, got in zip(reqs, together):
        t = (req.num_frames - 1) // 4 + 1
        assert tuple(got.final_latent.shape) == (8, t, 2, 2)
        assert tuple(got.image.shape) == (req.num_frames, HEIGHT, WIDTH, 3)
        (alone,), _ = generate(model, [req], max_num_seqs=1)
        torch.testing.assert_close(got.final_latent, alone.final_latent, atol=1e-5, rtol=0)


def test_the_shift_option_sets_the_schedule(model):
    shifted = load(shift=2.0)
    n = 4
    base = torch.linspace(1.0, 0.0, n + 1)[:-1]
    for m, shift in ((model, 5.0), (shifted, 2.0)):
        expected = torch.cat([shift * base / (1 + (shift - 1) * base), torch.zeros(1)])
        torch.testing.assert_close(m.sigmas(n, HEIGHT, WIDTH, FRAMES), expected, atol=1e-6, rtol=0)
    # The pipeline on the shifted adapter's scheduler gives the shifted adapter's ODE.
    noise = torch.randn((1, *model.latent_shape(HEIGHT, WIDTH, FRAMES)), generator=torch.Generator().manual_seed(2))
    case = TestHunyuanVideo15OnTheSuite.case
    (ours,), _ = generate(shifted, [ode(case, "fog", noise[0])], max_num_seqs=1)
    theirs = configure(euler_pipeline(shifted), shifted, case.guidance)(
        prompt="fog", negative_prompt="", height=HEIGHT, width=WIDTH, num_frames=FRAMES, latents=noise.clone(),
        num_inference_steps=case.steps, output_type="latent").frames
    torch.testing.assert_close(ours.final_latent, theirs[0].float(), atol=1e-5, rtol=0)


def test_bad_sizes_and_frame_counts_name_the_valid_values(model):
    with pytest.raises(ValueError, match=r"num_frames=6 .*4k\+1.* 5 and 9"):
        model.latent_shape(32, 32, 6)
    with pytest.raises(ValueError, match=r"height=40 px is not a multiple of 16.* 32 and 48"):
        model.latent_shape(40, 32, 5)
    with pytest.raises(ValueError, match=r"width=8 px is not a multiple of 16.* 16"):
        model.latent_shape(32, 8, 5)


def test_decoder_responds_to_the_latents(model):
    shape = model.latent_shape(HEIGHT, WIDTH, FRAMES)
    base = torch.zeros((2, *shape))
    video = model.decode(base)
    assert video.dtype == torch.uint8 and video.shape == (2, FRAMES, HEIGHT, WIDTH, 3)
    brightness = [float(model.decode(base + step).float().mean()) / 255 for step in (0.0, 0.25, 0.5)]
    # Measured: 0.38 at -0.5, 0.50, 0.64, 0.76 (a quarter of a latent std brightens by 0.14).
    assert brightness[1] - brightness[0] >= 0.05 and brightness[2] - brightness[1] >= 0.05, brightness
    assert model.decode(base - 0.5).float().mean() / 255 < brightness[0] - 0.05


# --- one `error:` line at load, before any model loads -------------------------------------
EDIT_DATA = ("recipe=tiny_qwen_image_edit_flowgrpo", "model.adapter=HunyuanVideo15Pipeline", "model.path=tiny:hunyuan_video15")


@pytest.mark.parametrize("overrides, expected", [
    (["rollout.sampling_options.num_frames=6"], ["rollout.sampling_options.num_frames=6", "4k+1", "5 or 9"]),
    (["rollout.sampling_options.width=40"], ["rollout.sampling_options.width=40", "multiple of 16", "32 or 48"]),
    (["+model.adapter_options.guidance_scale_2=2.0"], ["guidance_scale_2"]),
    (["model.adapter_options.shift=-1"], ["shift=-1"]),
    (list(EDIT_DATA), ["carries a source image", "model.adapter=HunyuanVideo15Pipeline"]),
])
def test_bad_input_is_one_error_line_at_load(capsys, tmp_path, overrides, expected):
    if overrides[0].startswith("recipe="):
        args = overrides
    else:
        args = ["recipe=tiny_hunyuan_video15_flowgrpo", *overrides]
    # trainer.total_steps=1: were a check missing, the run would end after one step.
    code = main([*args, "trainer.total_steps=1", f"trainer.output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for text in expected:
        assert text in lines[0], lines[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("metrics.jsonl"))

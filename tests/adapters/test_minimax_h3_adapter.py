"""The MiniMax-H3 adapter (`MiniMaxH3ModularPipeline`, text to audio + video) on `tiny:minimax_h3`:
the shared diffusion adapter suite against diffusers' own modular pipeline (its `t2va` blocks, run
whole: text encoder, layout, two schedules, loop), then the layout, the audio stream's coordinate,
the frame and size errors and responsive decoders."""
import pytest
import torch
from diffusers import MiniMaxH3Scheduler

from omni_rl.algos import latent_streams as ls
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from tests.adapters.diffusion_suite import (
    PROMPTS, AdapterCase, DiffusionAdapterSuite, build, generate, initial_noise, ode,
)

HEIGHT = WIDTH = 32
FRAMES = 124  # the shortest the model takes: 17 * 7 + 5 frames, 5.2 s at 24 fps


def pipeline(model, fresh: bool):
    """diffusers' `MiniMaxH3Blocks` on the model's components (fresh: every network loaded from the
    folder anew, so a LoRA loaded into it leaves the adapter's alone)."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel
    from diffusers.modular_pipelines import MiniMaxH3Blocks

    components = dict(
        transformer=model.transformer, vae=model.vae, audio_vae=model.audio_vae, text_encoder=model.text_encoder,
        tokenizer=model.tokenizer, processor=model.processor,
        scheduler=MiniMaxH3Scheduler.from_config(model.scheduler.config),
        audio_scheduler=MiniMaxH3Scheduler.from_config(model.audio_scheduler.config),
    )
    if fresh:
        components.update(
            transformer=MiniMaxH3Transformer3DModel.from_pretrained(model.path, subfolder="transformer"),
            vae=AutoencoderKLMiniMaxH3.from_pretrained(model.path, subfolder="vae"),
            audio_vae=AutoencoderKLMiniMaxH3Audio.from_pretrained(model.path, subfolder="audio_vae"),
        )
    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(**components)
    return pipe


def ratio(pipe) -> float:
    return pipe.scheduler.config.shift / pipe.audio_scheduler.config.shift


def pipeline_latents(pipe, prompt, latents, steps, guidance, case):
    """The pipeline's clean latents from the adapter-space noise (sigma 1: y is the audio noise),
    in the adapter's space (audio rows [2, L, C_a] times the shift ratio: y at sigma 0)."""
    assert guidance == 1.0  # guidance-distilled: the pipeline takes no scale
    audio = latents["audio"][0].permute(0, 2, 1)  # [2, L, C_a] -> the pipeline's [2, C_a, L]
    out = pipe(prompt=prompt, latents=latents["video"], audio_latents=audio, height=case.height, width=case.width,
               num_frames=case.num_frames, num_inference_steps=steps + 1, output=["latents", "audio_latents"])
    return ls.LatentStreams({"video": out["latents"],
                             "audio": (out["audio_latents"].permute(0, 2, 1) * ratio(pipe))[None]})


def load_lora(pipe, folder):
    pipe.load_lora_weights(folder)


CASE = AdapterCase(
    adapter="MiniMaxH3ModularPipeline", tiny="minimax_h3", height=HEIGHT, width=WIDTH, num_frames=FRAMES, fps=24.0,
    steps=4, guidance=1.0, pipeline=pipeline, pipeline_latents=pipeline_latents, load_lora=load_lora,
)


class TestMiniMaxH3(DiffusionAdapterSuite):
    case = CASE


@pytest.fixture(scope="module")
def model():
    return build(CASE)


def test_layout(model):
    assert model.makes_audio and model.size_multiple == 32
    # 124 frames: 7 chunks of 17 + 5 -> 7 * 5 + 2 = 37 latent frames; 124 / 24 * 40 = 206.7 -> 207 audio latents.
    assert model.latent_shape(HEIGHT, WIDTH, FRAMES) == {"video": (4, 37, 2, 2), "audio": (2, 207, 4)}
    assert model.latent_shape(64, 96, 141) == {"video": (4, 42, 4, 6), "audio": (2, 235, 4)}
    cond = model.encode_prompts(["a red cube", "fog"])
    assert cond["prompt_embeds"].shape == (2, 10, 16)  # byte tokens: the longest prompt's 10
    assert cond["prompt_embeds_mask"].sum(1).tolist() == [10, 3]
    assert list(model.trainable_modules()) == ["transformer"]
    assert not [p for m in model.frozen_modules() for p in m.parameters() if p.requires_grad]


def test_the_constants_are_the_pipelines(model):
    from omni_rl.models.loading import resolve_model_path  # noqa: F401  (the folder is built)
    from adapters import minimax_h3 as h3

    pipe = pipeline(model, False)
    assert (pipe.fps, pipe.min_duration, pipe.max_duration) == (h3.FPS, h3.MIN_SECONDS, h3.MAX_SECONDS)
    assert pipe.text_encoder_layer == h3.TEXT_ENCODER_LAYER and pipe.audio_channels == h3.AUDIO_CHANNELS
    assert (pipe.video_tag, pipe.text_tag, pipe.audio_tag) == (h3.VIDEO_TAG, h3.TEXT_TAG, h3.AUDIO_TAG)
    assert (pipe.pixel_mean, pipe.pixel_std) == (h3.PIXEL_MEAN, h3.PIXEL_STD)
    assert pipe.canvas_multiple == model.size_multiple


def test_the_schedules_are_the_schedulers(model):
    """The video sigmas are `MiniMaxH3Scheduler(shift=12)`'s for steps + 1 grid points, and the
    audio sigma derived from each is the shift-3 scheduler's at the same index."""
    video, audio = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    video.set_timesteps(9)
    audio.set_timesteps(9)
    torch.testing.assert_close(model.sigmas(8), video.sigmas, atol=0, rtol=0)
    from adapters.minimax_h3 import audio_sigma

    torch.testing.assert_close(audio_sigma(video.sigmas.double(), 12.0, 3.0).float(), audio.sigmas, atol=1e-7, rtol=0)
    assert float(video.sigmas[4]) > float(audio.sigmas[4]) + 0.1  # the two schedules really differ


def test_the_audio_coordinate_makes_the_kernels_euler_step_the_schedulers():
    """y = (sigma_v / sigma_a) x_a stepped by Euler at the video sigmas equals the audio scheduler's
    step at its own sigmas, for any x0 prediction (the DDIM invariance the adapter relies on)."""
    from adapters.minimax_h3 import audio_sigma

    video, audio = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    video.set_timesteps(6)
    audio.set_timesteps(6)
    gen = torch.Generator().manual_seed(0)
    x_a = torch.randn(8, generator=gen, dtype=torch.float64)
    for i in range(5):
        s_v, s_v_next = video.sigmas[i].double(), video.sigmas[i + 1].double()
        s_a, s_a_next = audio_sigma(s_v, 12.0, 3.0), audio_sigma(s_v_next, 12.0, 3.0)
        x0 = torch.randn(8, generator=gen, dtype=torch.float64)
        y = s_v / s_a * x_a
        y_next = y + (s_v_next - s_v) * (y - 4.0 * x0) / s_v  # the kernels' Euler step of y
        x_a = (s_a_next / s_a) * x_a + (1 - s_a_next / s_a) * x0  # the scheduler's step of x_a
        expected = 4.0 * x_a if s_a_next == 0 else s_v_next / s_a_next * x_a
        torch.testing.assert_close(y_next, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("overrides, message", [
    (["rollout.sampling_options.num_frames=125"], r"rollout.sampling_options.num_frames=125: expected 17n\+5 frames lasting 5 to 15 s at 24 fps \(124 .. 345.*e.g. 124 or 141"),
    (["rollout.sampling_options.num_frames=107"], r"rollout.sampling_options.num_frames=107: expected 17n\+5 .* e.g. 124"),
    (["rollout.sampling_options.num_frames=362"], r"rollout.sampling_options.num_frames=362: .* e.g. 328 or 345"),
    (["rollout.sampling_options.height=48"], r"rollout.sampling_options.height=48: expected a multiple of 32"),
    (["rollout.sampling_options.fps=16"], r"rollout.sampling_options.fps=16.0: expected 24"),
    (["rollout.sampling_options.guidance_scale=3.0"], r"rollout.sampling_options.guidance_scale=3.0: expected 1.0 .* guidance-distilled"),
    (["rollout.sampling_options.negative_prompt=blurry"], r"rollout.sampling_options.negative_prompt='blurry': .* takes none"),
])
def test_frames_sizes_and_guidance_the_model_cannot_take_fail_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["recipe=tiny_minimax_h3_flowgrpo", *overrides])


def test_a_bad_frame_count_is_one_error_line_at_the_cli(capsys):
    from omni_rl.cli import main

    assert main(["recipe=tiny_minimax_h3_flowgrpo", "rollout.sampling_options.num_frames=121"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: rollout.sampling_options.num_frames=121: expected 17n+5 frames"), err


def test_the_checkpoints_own_vae_sets_the_frame_form():
    from adapters.minimax_h3 import MiniMaxH3Adapter

    cfg = load_config(["recipe=tiny_minimax_h3_flowgrpo"])
    configs = {"vae": {"clip_length": 17, "temporal_downsample_factors": [1, 2, 2, 1, 1, 1]}}
    MiniMaxH3Adapter.check_model_limits(cfg, configs)  # the released form: 124 = 17 * 7 + 5
    configs["vae"]["clip_length"] = 16  # 16n + 4 frames
    with pytest.raises(ValueError, match=r"rollout.sampling_options.num_frames=124: expected 16n\+4 frames .* e.g. 132"):
        MiniMaxH3Adapter.check_model_limits(cfg, configs)


def test_decoders_respond_to_each_stream(model):
    shape = model.latent_shape(HEIGHT, WIDTH, FRAMES)
    zeros = ls.stack([ls.LatentStreams({k: torch.zeros(s) for k, s in shape.items()})])
    brighter = ls.LatentStreams({"video": zeros["video"] + 0.5, "audio": zeros["audio"]})
    louder = ls.LatentStreams({"video": zeros["video"], "audio": zeros["audio"] + 0.5})
    frames = model.decode(zeros)
    assert frames.shape == (1, FRAMES, HEIGHT, WIDTH, 3) and frames.dtype == torch.uint8
    assert model.decode(brighter).float().mean() > frames.float().mean() + 5
    wave, rate = model.decode_audio(zeros)
    assert rate == 8000 and wave.shape[:2] == (1, 2) and wave.shape[2] == 207 * 200
    assert torch.equal(model.decode(louder), frames)
    assert (model.decode_audio(louder)[0] - wave).abs().max() > 1e-2


def test_the_prompt_moves_both_streams(model):
    noise = initial_noise(model, CASE, seed=1)
    (a,), _ = generate(model, [ode(CASE, PROMPTS[0], noise)], max_num_seqs=1)
    (b,), _ = generate(model, [ode(CASE, PROMPTS[2], noise)], max_num_seqs=1)
    for name in ("video", "audio"):
        assert (a.final_latent[name] - b.final_latent[name]).abs().max() > 1e-3, name


def test_the_tiny_checkpoint_is_in_the_released_modular_layout_and_diffusers_loads_it(model):
    """`tiny:minimax_h3` is saved as the released checkpoint is, by the pipeline's own
    `save_pretrained` (a modular_model_index.json, no model_index.json), and diffusers'
    `ModularPipeline.from_pretrained` + `load_components` loads from it the weights the adapter runs."""
    import json
    from pathlib import Path

    from diffusers import ModularPipeline

    from adapters.tiny.minimax_h3 import TINY_HUB_ID
    from omni_rl.models.loading import check_model_folder, index_components

    folder = Path(model.path)
    assert not (folder / "model_index.json").exists()
    index = json.loads((folder / "modular_model_index.json").read_text())
    assert index["_class_name"] == "MiniMaxH3ModularPipeline"
    assert index["transformer"][2]["pretrained_model_name_or_path"] == TINY_HUB_ID
    assert set(index_components(index)) >= {"transformer", "vae", "audio_vae", "text_encoder", "scheduler",
                                             "audio_scheduler"}
    check_model_folder(folder, "tiny:minimax_h3")
    pipe = ModularPipeline.from_pretrained(str(folder))
    pipe.load_components(torch_dtype=torch.float32)
    assert type(pipe).__name__ == "MiniMaxH3ModularPipeline"
    assert pipe.audio_scheduler.config.shift == model.audio_scheduler.config.shift
    for name in ("transformer", "audio_vae"):
        # The adapter's transformer carries its LoRA (peft wraps each target as `base_layer`).
        mine = {k.replace(".base_layer", ""): v for k, v in getattr(model, name).state_dict().items() if "lora" not in k}
        theirs = getattr(pipe, name).state_dict()
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), name


def _output_grads(model, cfg, stream_advantages):
    """The gradients reaching the transformer's video and audio outputs (`proj_out`,
    `audio_proj_out`) from the family's loss on trained step 0 of two rolled-out samples."""
    from omni_rl.data.diffusion_batch import DiffusionBatch
    from omni_rl.families.diffusion import DiffusionFamily
    from tests.adapters.diffusion_suite import request

    family = DiffusionFamily(cfg, model)
    results, _ = generate(model, [request(CASE, p, seed=i, model=model) for i, p in enumerate(PROMPTS[:2])],
                          max_num_seqs=2)
    batch = DiffusionBatch.from_results(results, [{}, {}], [0, 0])
    policy = family.behaviour_policy(batch, micro_batch_size=2)
    batch.old_log_probs, batch.old_means = policy.log_probs, policy.means
    batch.advantages, batch.stream_advantages = torch.tensor([1.0, -1.0]), stream_advantages
    grads = {}

    def keep(name):
        def hook(module, inputs, output):
            output.register_hook(lambda g: grads.__setitem__(name, g.detach().clone()))
        return hook

    t = model.transformer
    handles = [t.proj_out.register_forward_hook(keep("video")), t.audio_proj_out.register_forward_hook(keep("audio"))]
    try:
        loss, _ = family.loss(batch, 0)
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
        for p in model.trainable_root().parameters():
            p.grad = None
    return grads


def test_routed_a_video_only_reward_leaves_the_audio_stream_without_gradient(model):
    """algo.advantage_options.modality_routing on the real adapter: with the audio stream's
    advantage 0 (a video-only reward), no gradient reaches the transformer's audio output; without
    routing the one advantage reaches it."""
    base = [f"model.adapter={CASE.adapter}", f"model.path=tiny:{CASE.tiny}", f"rollout.sampling_options.num_frames={FRAMES}",
            f"rollout.sampling_options.height={HEIGHT}", f"rollout.sampling_options.width={WIDTH}", "rollout.sampling_options.guidance_scale=1.0", "rollout.sampling_options.fps=24",
            "rollout.sampling_options.sde_window_range=null", "reward.rewards=[{name: video_brightness}]"]
    routed_cfg = load_config([*base, "algo.advantage_options.modality_routing=true"])
    routed = _output_grads(model, routed_cfg, ls.LatentStreams({"video": torch.tensor([1.0, -1.0]),
                                                               "audio": torch.zeros(2)}))
    assert torch.equal(routed["audio"], torch.zeros_like(routed["audio"]))
    assert float(routed["video"].abs().sum()) > 0
    joint = _output_grads(model, load_config(base), None)
    assert float(joint["audio"].abs().sum()) > 0

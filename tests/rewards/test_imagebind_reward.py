"""rewards/imagebind: the checkpoint key layout, strict loading, the input pipeline, and the
reward on a tiny random ImageBind saved as a state dict and loaded back by path."""
import math

import pytest
import torch

from omni_rl.reward import RewardInputError, build_reward
from omni_rl.reward.media import MediaSamples
from rewards.imagebind import ImageBindConfig, ImageBindModel
from rewards.imagebind.data import audio_clip_bounds, clip_frame_indices, log_mel, tokenize
from rewards.tiny_models import build_tiny_imagebind

PROMPTS = ["a dog barking", "rain on a roof", "x", "a very long prompt " * 30]


def test_huge_key_layout_matches_metas_checkpoint():
    with torch.device("meta"):
        state = ImageBindModel(ImageBindConfig()).state_dict()
    expected = {
        "modality_preprocessors.vision.rgbt_stem.proj.1.weight": (1280, 3, 2, 14, 14),
        "modality_preprocessors.vision.pos_embedding_helper.pos_embed": (1, 257, 1280),
        "modality_preprocessors.vision.cls_token": (1, 1, 1280),
        "modality_preprocessors.text.token_embedding.weight": (49408, 1024),
        "modality_preprocessors.text.pos_embed": (1, 77, 1024),
        "modality_preprocessors.audio.rgbt_stem.proj.weight": (768, 1, 16, 16),
        "modality_preprocessors.audio.rgbt_stem.norm_layer.weight": (768,),
        "modality_preprocessors.audio.pos_embedding_helper.pos_embed": (1, 229, 768),  # 12 x 19 patches + cls
        "modality_trunks.vision.pre_transformer_layer.0.weight": (1280,),
        "modality_trunks.vision.blocks.0.attn.in_proj_weight": (3840, 1280),
        "modality_trunks.vision.blocks.31.mlp.fc2.weight": (1280, 5120),
        "modality_trunks.text.blocks.23.norm_2.bias": (1024,),
        "modality_trunks.audio.blocks.11.attn.bias_k": (1, 1, 768),
        "modality_heads.vision.2.weight": (1024, 1280),
        "modality_heads.text.proj.1.weight": (1024, 1024),
        "modality_heads.audio.2.weight": (1024, 768),
        "modality_postprocessors.text.1.log_logit_scale": (),
        "modality_postprocessors.audio.1.log_logit_scale": (),
    }
    for key, shape in expected.items():
        assert tuple(state[key].shape) == shape, key
    assert "modality_trunks.vision.blocks.32.norm_1.weight" not in state
    no_pre_norm = ("modality_trunks.text.pre_transformer_layer", "modality_trunks.audio.pre_transformer_layer")
    assert not any(k.startswith(no_pre_norm) for k in state)
    assert not any("bias_k" in k for k in state if ".audio." not in k)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_imagebind")
    config = build_tiny_imagebind(folder)
    return {"checkpoint": str(folder / "imagebind.pth"), "config": config, "tokenizer": str(folder / "tokenizer")}


def _samples(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "audio": torch.randn(n, 40000, generator=g) * 0.1,  # 2.5 s at 16 kHz
        "video": torch.randint(0, 256, (n, 12, 30, 40, 3), dtype=torch.uint8, generator=g),  # 3 s at 4 fps
    }


@pytest.mark.parametrize("mode", ["text_audio", "text_video", "audio_video", "all"])
def test_four_samples_batched_equals_one_at_a_time(tiny, mode):
    scorer = build_reward("imagebind", mode=mode, sample_rate=16000, fps=4, **tiny)
    samples = _samples()
    scores = scorer(samples, PROMPTS, [{}] * 4)
    assert len(scores) == 4 and all(isinstance(s, float) and -1 <= s <= 1 for s in scores)
    single = [scorer({k: v[i:i + 1] for k, v in samples.items()}, PROMPTS[i:i + 1], [{}])[0] for i in range(4)]
    assert scores == pytest.approx(single, abs=1e-5)


def test_all_is_the_mean_of_the_three_pairs_and_single_modalities_need_no_dict(tiny):
    samples = _samples(seed=1)
    meta = [{"sample_rate": 16000, "fps": 4}] * 4

    def run(mode, x):
        return torch.tensor(build_reward("imagebind", mode=mode, **tiny)(x, PROMPTS, meta))

    text_audio = run("text_audio", samples["audio"])  # a plain audio batch
    text_video = run("text_video", list(samples["video"]))  # a list of [T, H, W, 3] videos
    audio_video = run("audio_video", samples)
    mean = (text_audio + text_video + audio_video) / 3
    assert run("all", samples).tolist() == pytest.approx(mean.tolist(), abs=1e-6)


def test_score_is_the_cosine_of_the_averaged_clip_embeddings(tiny):
    from transformers import CLIPTokenizer

    from rewards.imagebind import load_checkpoint, read_state_dict
    from rewards.imagebind.data import audio_features

    samples = _samples(2, seed=2)
    scorer = build_reward("imagebind", mode="text_audio", sample_rate=16000, **tiny)
    scores = scorer(samples["audio"], PROMPTS[:2], [{}] * 2)
    model = ImageBindModel(ImageBindConfig.from_dict(tiny["config"])).eval()
    load_checkpoint(model, read_state_dict(tiny["checkpoint"]))
    ids = tokenize(CLIPTokenizer.from_pretrained(tiny["tokenizer"]), PROMPTS[:2], 77)
    with torch.no_grad():
        for i in range(2):
            mels = audio_features(samples["audio"][i], num_mel_bins=128, target_len=204, n_clips=3)
            audio = model.embed_audio(mels).mean(0)
            text = model.embed_text(ids[i:i + 1])[0]
            assert scores[i] == pytest.approx(torch.cosine_similarity(audio, text, dim=0).item(), abs=1e-5)


def test_renamed_key_fails_clearly_and_other_modalities_are_skipped(tiny, tmp_path):
    state = torch.load(tiny["checkpoint"])
    # What Meta's file also holds: other modalities' weights and the causal mask buffer.
    state["modality_trunks.depth.blocks.0.norm_1.weight"] = torch.ones(3)
    state["modality_preprocessors.text.mask"] = torch.zeros(77, 77)
    torch.save(state, tmp_path / "full.pth")
    build_reward("imagebind", **{**tiny, "checkpoint": str(tmp_path / "full.pth")})

    state["modality_heads.vision.3.weight"] = state.pop("modality_heads.vision.2.weight")
    torch.save(state, tmp_path / "renamed.pth")
    with pytest.raises(ValueError, match=r"1 missing key\(s\): modality_heads.vision.2.weight; "
                                         r"1 unexpected key\(s\): modality_heads.vision.3.weight"):
        build_reward("imagebind", **{**tiny, "checkpoint": str(tmp_path / "renamed.pth")})


def test_safetensors_checkpoint_and_wrong_sizes(tiny, tmp_path):
    from safetensors.torch import save_file

    state = torch.load(tiny["checkpoint"])
    save_file(state, str(tmp_path / "ib.safetensors"))
    a = build_reward("imagebind", mode="text_video", fps=4, **{**tiny, "checkpoint": str(tmp_path / "ib.safetensors")})
    b = build_reward("imagebind", mode="text_video", fps=4, **tiny)
    video = _samples(2)["video"]
    assert a(video, PROMPTS[:2], [{}] * 2) == b(video, PROMPTS[:2], [{}] * 2)
    with pytest.raises(ValueError, match=r"text_embed_dim|shape .* but the configured model expects"):
        build_reward("imagebind", **{**tiny, "config": {**tiny["config"], "out_embed_dim": 8}})


def test_option_and_input_errors(tiny, tmp_path):
    with pytest.raises(ValueError, match="CC-BY-NC-SA 4.0"):
        build_reward("imagebind")
    with pytest.raises(FileNotFoundError, match="no such file"):
        build_reward("imagebind", checkpoint=str(tmp_path / "none.pth"))
    with pytest.raises(ValueError, match="mode='video'; expected one of"):
        build_reward("imagebind", mode="video", **tiny)
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['width'\]"):
        build_reward("imagebind", **{**tiny, "config": {"width": 3}})
    scorer = build_reward("imagebind", mode="audio_video", **tiny)
    samples = _samples(2)
    with pytest.raises(RewardInputError, match="needs both audio and video"):
        scorer(samples["video"], PROMPTS[:2], [{}] * 2)
    with pytest.raises(RewardInputError, match=r"video\[0\] has no frame rate.*metadata\[0\]\['fps'\]"):
        scorer(samples, PROMPTS[:2], [{"sample_rate": 16000}] * 2)
    with pytest.raises(RewardInputError, match="expected uint8"):
        meta = [{"sample_rate": 16000, "fps": 4}] * 2
        scorer({"audio": samples["audio"], "video": samples["video"].float()}, PROMPTS[:2], meta)


def test_clip_sampling_spreads_two_second_clips_evenly():
    # 48 frames at 8 fps = 6 s: 5 clips start at 0, 1, 2, 3, 4 s; each spans 16 frames.
    assert clip_frame_indices(48, 8, 5) == [(0, 15), (8, 23), (16, 31), (24, 39), (32, 47)]
    assert clip_frame_indices(10, 8, 5) == [(0, 9)] * 5  # shorter than a clip: the whole video
    # 5 s of audio: 3 clips at 0, 1.5, 3 s.
    assert audio_clip_bounds(80000, 3) == [(0, 32000), (24000, 56000), (48000, 80000)]
    assert audio_clip_bounds(8000, 3) == [(0, 32000)] * 3


def test_log_mel_matches_kaldi_fbank():
    # Reference values from torchaudio.compliance.kaldi.fbank (torchaudio 2.11) with ImageBind's
    # arguments (htk_compat, hanning, 128 bins, dither 0, 25 ms / 10 ms) on this signal.
    t = torch.arange(16000, dtype=torch.float64) / 16000
    wave = (0.5 * torch.sin(2 * math.pi * 440 * t) + 0.25 * torch.sin(2 * math.pi * 3000 * t)
            + 0.01 * torch.sin(2 * math.pi * 7000 * t)).float()
    mel = log_mel(wave - wave.mean(), 128)
    assert mel.shape == (128, 98)  # 1 + (16000 - 400) // 160 frames
    reference = {  # (bin, frame): value
        (0, 0): -14.0926, (0, 37): -12.0458, (5, 0): -14.4748, (5, 97): -13.6538,
        (17, 0): -6.4087, (17, 37): -6.3886, (40, 0): -13.2217, (40, 97): -13.4062,
        (90, 0): -10.1643, (90, 37): -10.1647,
    }
    # Both sides are float32 real FFTs (torch.fft.rfft runs MKL's DFT, whose kernels MKL picks by
    # CPU: an Intel Xeon's AVX-512 ones round otherwise than an AMD EPYC's). The FFT rounds every
    # coefficient by about eps times the frame's whole amplitude, so a bin's power is off by
    # about eps * sqrt(frame power / bin power) relatively: 5e-3 in the log at bin 0 of frame 0
    # (1e-3 measured: the float64 value is -14.0936, Intel's float32 gives -14.0937 and AMD's
    # -14.0926, the reference's), 1e-4 at the loud bin 17. Within four of that (at most 2 seen
    # against float64 over all bins and frames), each side's, plus the reference's rounding.
    power = mel.double().exp()
    fft_rounding = torch.finfo(torch.float32).eps * (power.sum(dim=0) / power).sqrt()  # [bins, frames]
    for (b, f), value in reference.items():
        assert mel[b, f].item() == pytest.approx(value, abs=2e-4 + 4 * fft_rounding[b, f].item()), (b, f)


@pytest.mark.parametrize("mode", ["text_audio", "text_video", "audio_video", "all"])
def test_media_samples_score_as_the_dict_with_its_rates(tiny, mode):
    # The MediaSamples' fps and sample_rate count; the metadata and the options are not read.
    samples = _samples(seed=3)
    scorer = build_reward("imagebind", mode=mode, **tiny)
    expected = scorer(samples, PROMPTS, [{"sample_rate": 16000, "fps": 4}] * 4)
    media = MediaSamples(video=samples["video"], fps=4, audio=samples["audio"], sample_rate=16000)
    assert scorer(media, PROMPTS, [{"fps": 99, "sample_rate": 8000}] * 4) == pytest.approx(expected, abs=1e-6)


def test_media_samples_stereo_audio_is_mixed_down_and_a_missing_stream_is_named(tiny):
    samples = _samples(2, seed=4)
    scorer = build_reward("imagebind", mode="text_audio", **tiny)
    stereo = torch.stack([samples["audio"], samples["audio"]], dim=1)  # [B, 2, S], both channels equal
    media = MediaSamples(audio=stereo, sample_rate=16000)
    assert scorer(media, PROMPTS[:2], [{}] * 2) == pytest.approx(
        scorer(samples["audio"], PROMPTS[:2], [{"sample_rate": 16000}] * 2), abs=1e-6
    )
    with pytest.raises(RewardInputError, match="imagebind: the MediaSamples hold no video"):
        build_reward("imagebind", mode="all", **tiny)(media, PROMPTS[:2], [{}] * 2)
    with pytest.raises(RewardInputError, match="imagebind: the MediaSamples hold no audio"):
        build_reward("imagebind", mode="audio_video", **tiny)(
            MediaSamples(video=samples["video"], fps=4), PROMPTS[:2], [{}] * 2
        )


def test_the_manager_hands_imagebind_the_media_samples(tiny):
    from omni_rl.reward import RewardManager, RewardSpec

    samples = _samples(2, seed=5)
    media = MediaSamples(video=samples["video"], fps=4, audio=samples["audio"], sample_rate=16000)
    manager = RewardManager([RewardSpec("imagebind", kwargs={"mode": "all", **tiny})])
    direct = build_reward("imagebind", mode="all", **tiny)(media, PROMPTS[:2], [{}] * 2)
    assert manager.score(media, PROMPTS[:2]).total.tolist() == pytest.approx(direct, abs=1e-6)

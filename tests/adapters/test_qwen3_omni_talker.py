"""The Qwen3-Omni talker stage on `tiny:qwen3_omni_talker`: sampling and teacher-forced replay
agree, frames end at the codec's end token, the tiny code2wav's loudness follows the codes, what
trains is what `model.adapter_options.trainable` names, and a checkpoint without a talker is refused."""
import json
from pathlib import Path

import pytest
import torch

from adapters.qwen3_omni_talker import NoTalkerError, check_has_talker
from omni_rl.models.factory import build_model
from omni_rl.models.loading import resolve_model_path
from tests.adapters.diffusion_suite import model_config

ADAPTER = "Qwen3OmniMoeForConditionalGeneration"


def talker(stage="talker", lora=False, **options):
    cfg = model_config(adapter=ADAPTER, stage=stage, path="tiny:qwen3_omni_talker", **options)
    cfg.lora.enabled = lora
    return build_model(cfg, torch.device("cpu"), ())


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return talker(trainable="both")


def answers(model):
    prompt = model.encode_prompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}])
    other = model.encode_prompt([{"role": "user", "content": "Count to three, slowly."}])
    eos = model.tokenizer.eos_token_id
    return [prompt.input_ids, other.input_ids], [torch.tensor([104, 105, eos]), torch.tensor([97])]


def test_rollout_log_probs_are_the_teacher_forced_ones(model):
    prompts, said = answers(model)
    sample = model.sample_speech(prompts, said, [1, 2], 12, 1.0)
    assert sample.codes.shape == (2, 12, 4) and sample.frame_mask.shape == (2, 12)
    replay = model.speech_log_probs(prompts, said, sample.codes, sample.frame_mask, 1.0, sample.prefix_width)
    mask = sample.frame_mask.bool()
    assert (replay - sample.log_probs)[mask].abs().max() <= 1e-5
    # Each frame is 4 tokens: its log-prob is below any one token's bound, log(1) = 0, and finite.
    assert torch.isfinite(replay[mask]).all() and (replay[mask] < 0).all()
    # A frame's log-prob is its tokens' sum: more codebooks counted, lower (or equal) log-prob.
    assert sample.log_probs[mask].mean() < -3 * 1.0


def test_end_token_ends_the_utterance_and_has_no_residual_codes(model):
    prompts, said = answers(model)
    # Force the end token in frame 2 of row 0 and replay: its log-prob is the talker token's alone.
    sample = model.sample_speech(prompts, said, [3, 4], 6, 1.0)
    codes, mask = sample.codes.clone(), sample.frame_mask.clone()
    codes[0, 2] = torch.tensor([model.codec_eos_id, 0, 0, 0])
    codes[0, 3:] = 0
    mask[0, 3:] = 0
    replay = model.speech_log_probs(prompts, said, codes, mask, 1.0, sample.prefix_width)
    changed = codes.clone()
    changed[0, 2, 1:] = torch.tensor([5, 6, 7])  # residual codes of an end frame count for nothing
    again = model.speech_log_probs(prompts, said, changed, mask, 1.0, sample.prefix_width)
    assert torch.equal(replay[0, :3], again[0, :3])
    waves = model.decode_speech(codes, mask)
    # Two spoken frames before the end frame: code2wav's 8 samples a frame, less its causal trim.
    assert 0 < waves[0].numel() <= 2 * 8 and waves[1].numel() > waves[0].numel()


def test_greedy_speech_is_deterministic_and_the_sampled_one_follows_its_seed(model):
    prompts, said = answers(model)
    a = model.sample_speech(prompts, said, [1, 2], 8, 0.0)
    b = model.sample_speech(prompts, said, [7, 8], 8, 0.0)
    assert torch.equal(a.codes, b.codes)
    c = model.sample_speech(prompts, said, [1, 2], 8, 1.0)
    d = model.sample_speech(prompts, said, [1, 2], 8, 1.0)
    e = model.sample_speech(prompts, said, [5, 6], 8, 1.0)
    assert torch.equal(c.codes, d.codes) and not torch.equal(c.codes, e.codes)


def test_tiny_code2wav_loudness_follows_the_codes(model):
    """Per-code loudness: a clip of one code repeated; the spread is what RL can climb."""
    with torch.no_grad():
        rms = [float(model.code2wav(torch.full((1, 4, 12), c)).pow(2).mean().sqrt()) for c in range(56)]
    assert max(rms) - min(rms) > 0.3 and max(rms) < 0.99  # well apart, off the +-1 clamp


def test_only_the_named_part_trains():
    parts = {"talker": talker(trainable="talker"), "code_predictor": talker(trainable="code_predictor")}
    for name, m in parts.items():
        trained = {n for n, p in m.talker.named_parameters() if p.requires_grad}
        in_predictor = {n.startswith("code_predictor.") for n in trained}
        assert in_predictor == ({True} if name == "code_predictor" else {False})
        assert not any(p.requires_grad for p in m.thinker.parameters())
        assert not any(p.requires_grad for p in m.code2wav.parameters())
    lora = talker(lora=True, trainable="talker")
    names = [n for n, p in lora.trainable_module().named_parameters() if p.requires_grad]
    assert names and all("lora_" in n and "code_predictor" not in n for n in names)


def test_thinker_talker_trains_both_halves_from_one_loss():
    m = talker(stage="thinker_talker", lora=True, trainable="both")
    prompts, said = answers(m)
    sample = m.sample_speech(prompts, said, [1, 2], 4, 1.0)
    seq = torch.cat([prompts[0], said[0]])[None]
    tokens = m.token_log_probs(seq, torch.ones_like(seq), len(prompts[0]), 1.0)
    frames = m.speech_log_probs(prompts, said, sample.codes, sample.frame_mask, 1.0)
    (tokens.sum() + (frames * sample.frame_mask).sum()).backward()
    for name, module in m.trainable_modules().items():
        grads = [p.grad for p in module.parameters() if p.requires_grad]
        assert grads and any(g is not None and g.abs().sum() > 0 for g in grads), name


def test_media_prompts_are_refused(model):
    from PIL import Image

    with pytest.raises(ValueError, match="text prompts"):
        model.encode_prompt([{"role": "user", "content": "What is this?"}], {"images": [Image.new("RGB", (32, 32))]})


def test_a_checkpoint_without_a_talker_is_refused_before_its_weights_load(tmp_path):
    folder = Path(resolve_model_path("tiny:qwen3_omni_talker"))
    config = json.loads((folder / "config.json").read_text())
    config["enable_audio_output"] = False
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(NoTalkerError, match="has no talker"):
        check_has_talker(str(tmp_path))
    check_has_talker(str(folder))  # the tiny one speaks

"""The Qwen3-Omni thinker adapter on `tiny:qwen3_omni`: stripping, frozen towers, multimodal rotary
positions under left padding, LoRA in PEFT's format, cached decoding in the native text engine."""
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from adapters.qwen3_omni import Qwen3OmniThinkerAdapter
from omni_rl.config.schema import LoraConfig, ModelConfig
from omni_rl.models import build_model
from omni_rl.rollout.text_native import NativeTextEngine
from omni_rl.rollout.text_sampling import collate_media, left_pad
from omni_rl.rollout.text_types import TextRequest
from tests.adapters.diffusion_suite import model_config

ADAPTER = "Qwen3OmniMoeForConditionalGeneration"


def load(**changes):
    cfg = model_config(adapter=ADAPTER, stage="thinker", path="tiny:qwen3_omni", **changes)
    return build_model(cfg, torch.device("cpu"))


@pytest.fixture(scope="module")
def model():
    return load()


def image(seed: int, size=(32, 32)) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def audio(seconds: float, rate: int = 16000):
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate


def image_prompt(model):
    return model.encode_prompt([{"role": "user", "content": "what is it?"}], {"images": [image(0)]})


def text_prompt(model):
    return model.encode_prompt([{"role": "user", "content": "a longer question with no picture at all, please"}])


def batch_of(prompts, responses, pad_id):
    """Left-padded prompts followed by right-aligned responses of equal length."""
    ids, mask = left_pad([p.input_ids for p in prompts], pad_id)
    response = torch.stack(responses)
    return torch.cat([ids, response], 1), torch.cat([mask, torch.ones_like(response)], 1), ids.shape[1]


def test_talker_and_code2wav_are_stripped(model):
    names = [n for n, _ in model.trainable_module().named_parameters()]
    assert names and not [n for n in names if any(s in n for s in ("talker", "code2wav", "code_predictor"))]
    assert not [type(m).__name__ for m in model.trainable_module().modules() if "Talker" in type(m).__name__]
    # LoRA sits on the language model's q/k/v/o only: not on the audio tower's own q/k/v_proj.
    trained = [n for n, p in model.trainable_module().named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n and ".language_model." in n for n in trained)
    assert {n.split(".")[-4] for n in trained} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    # Configured names are scoped the same way; a tower prefix reaches into that tower.
    lora = LoraConfig(target_modules=["o_proj", "audio_tower.self_attn.q_proj"])
    pattern = Qwen3OmniThinkerAdapter.lora_targets(SimpleNamespace(cfg=ModelConfig(lora=lora), default_lora_targets=()))
    matched = {n for n, _ in model.thinker.named_modules() if re.fullmatch(pattern, n)}
    assert matched == {
        "model.language_model.layers.0.self_attn.o_proj", "model.language_model.layers.1.self_attn.o_proj",
        "model.audio_tower.layers.0.self_attn.q_proj",
    }


@pytest.mark.parametrize("frozen", ["visual", "audio_tower"])
def test_frozen_towers_get_no_gradient(frozen):
    # Full fine-tuning with one tower frozen: it alone is left without gradients.
    model = load(lora=LoraConfig(enabled=False), freeze_vision_tower=frozen == "visual",
                 freeze_audio_tower=frozen == "audio_tower")
    prompt = model.encode_prompt([{"role": "user", "content": "hi"}], {"images": [image(1)], "audio": [audio(0.5)]})
    seqs, mask, start = batch_of([prompt], [torch.tensor([97, 98, 99])], model.pad_token_id)
    model.token_log_probs(seqs, mask, start, 1.0, prompt.media).sum().backward()
    for name, tower in model.towers().items():
        grads = [p.grad is not None for p in tower.parameters()]
        assert not any(grads) if name == frozen else any(grads), name
    assert model.thinker.lm_head.weight.grad is not None


def test_positions_are_int64_and_match_transformers(model):
    prompt = model.encode_prompt(
        [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "and"}, {"type": "image"}]}],
        {"images": [image(2, (40, 56))], "audio": [audio(1.0)]},
    )
    ids = prompt.input_ids[None]
    mask = torch.ones_like(ids)
    positions, deltas = model.rope_positions(ids, mask, prompt.media["image_grid_thw"])
    assert positions.dtype == torch.int64 and positions.shape == (3, 1, ids.shape[1])
    ref, ref_deltas = model.thinker.model.get_rope_index(
        ids, prompt.media["image_grid_thw"], None, mask, False, prompt.media["audio_feature_lengths"], None
    )
    assert torch.equal(positions, ref.long()) and torch.equal(deltas, ref_deltas.long().view(-1))
    # Left padding shifts nothing: the padded row's real tokens keep their positions.
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), ids], 1)
    pad_mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), mask], 1)
    shifted, _ = model.rope_positions(padded, pad_mask, prompt.media["image_grid_thw"])
    assert torch.equal(shifted[..., 5:], positions)


def test_left_padded_batch_equals_each_prompt_alone(model):
    prompts = [image_prompt(model), text_prompt(model)]
    assert len(prompts[0].input_ids) < len(prompts[1].input_ids)  # the image row is the padded one
    responses = [torch.tensor([104, 105, 33, 10]), torch.tensor([120, 121, 122, 123])]
    seqs, mask, start = batch_of(prompts, responses, model.pad_token_id)
    with torch.no_grad():
        both = model.token_log_probs(seqs, mask, start, 1.0, collate_media([p.media for p in prompts]))
        for i, (prompt, response) in enumerate(zip(prompts, responses)):
            s, m, st = batch_of([prompt], [response], model.pad_token_id)
            alone = model.token_log_probs(s, m, st, 1.0, prompt.media)
            torch.testing.assert_close(both[i], alone[0], atol=1e-5, rtol=0)


def test_lora_saves_in_peft_format_and_loads_back(tmp_path):
    from peft import PeftModel
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = load()
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_lora(str(tmp_path / "lora"))
    assert (tmp_path / "lora" / "adapter_config.json").is_file()
    base = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model.path).thinker
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "lora")).eval()
    prompt = image_prompt(model)
    ids = prompt.input_ids[None]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        # transformers places the rotary positions itself here (get_rope_index).
        theirs = loaded(input_ids=ids, attention_mask=mask, pixel_values=prompt.media["pixel_values"],
                        image_grid_thw=prompt.media["image_grid_thw"]).logits.float()
        ours = model.forward_logits(ids, mask, prompt.media)[0]
    keep = [v for v in range(ours.shape[-1]) if v not in model.placeholder_token_ids]
    torch.testing.assert_close(theirs[..., keep], ours[..., keep], atol=1e-5, rtol=0)
    with torch.no_grad(), model.reference_policy():
        reference = model.forward_logits(ids, mask, prompt.media)[0]
    assert (reference - ours).abs().max() > 1e-4


def test_logits_to_keep_cuts_the_head_inside_the_thinkers_forward(model):
    """The thinker has no `logits_to_keep` of its own: the adapter cuts the head's input for the
    call, so an image prompt's last positions come out alone, equal to the whole pass's tail, and
    the head is whole again afterwards."""
    prompt = image_prompt(model)
    ids = prompt.input_ids[None]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        whole = model.forward_logits(ids, mask, prompt.media)[0]
        tail = model.forward_logits(ids, mask, prompt.media, logits_to_keep=3)[0]
        again = model.forward_logits(ids, mask, prompt.media)[0]
    assert tail.shape == (1, 3, whole.shape[-1]) and again.shape == whole.shape
    torch.testing.assert_close(tail, whole[:, -3:], atol=1e-5, rtol=0)


def test_native_engine_log_probs_match_recompute(model):
    from omni_rl.data.text_batch import TextBatch

    prompts = [image_prompt(model), text_prompt(model)]
    requests = [TextRequest(prompt=p, seed=s, max_new_tokens=6) for s, p in enumerate(prompts)]
    results = NativeTextEngine(model).generate(requests)
    batch = TextBatch.from_results(results, ["a", "b"], [{}, {}], [0, 1], model.pad_token_id)
    with torch.no_grad():
        recomputed = model.token_log_probs(
            batch.sequences, batch.attention_mask, batch.prompt_width, batch.temperature, collate_media(batch.media)
        )
    on = batch.response_mask.bool()
    torch.testing.assert_close(recomputed[on], batch.rollout_log_probs[on], atol=1e-4, rtol=0)
    assert not any(set(r.response_ids.tolist()) & set(model.placeholder_token_ids) for r in results)
    # Cached decoding (multimodal offsets kept in the cache) samples what full recomputation does.
    model.supports_kv_cache = False
    try:
        uncached = NativeTextEngine(model).generate(
            [TextRequest(prompt=p, seed=s, max_new_tokens=6) for s, p in enumerate(prompts)]
        )
    finally:
        del model.supports_kv_cache
    for a, b in zip(results, uncached):
        assert torch.equal(a.response_ids, b.response_ids)
        torch.testing.assert_close(a.log_probs, b.log_probs, atol=1e-5, rtol=0)


def test_gradient_checkpointing_recomputes_and_keeps_gradients(model):
    checkpointed = load(gradient_checkpointing=True)
    checkpointed.load_named_tensors(model.named_trainable_tensors())  # the same LoRA initialisation
    prompt = image_prompt(model)
    seqs, mask, start = batch_of([prompt], [torch.tensor([97, 98])], model.pad_token_id)
    calls = []
    attention = checkpointed.thinker.model.language_model.layers[0].self_attn
    attention.register_forward_hook(lambda *_: calls.append(1))
    grads = []
    for m in (model, checkpointed):
        m.token_log_probs(seqs, mask, start, 1.0, prompt.media).sum().backward()
        grads.append([p.grad for p in m.trainable_parameters()])
    for p in model.trainable_parameters():
        p.grad = None
    assert len(calls) == 2  # the forward, then its recomputation in the backward pass
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_audio_is_resampled_to_the_feature_extractor_rate(model):
    from adapters.qwen3_omni import resample_audio

    samples, _ = audio(0.25, 8000)
    up = resample_audio(samples, 8000, 16000)
    t = np.arange(len(up)) / 16000
    assert len(up) == 4000
    # A whole number of periods (110), so the FFT's periodic extension is exact.
    np.testing.assert_allclose(up, 0.3 * np.sin(2 * np.pi * 440 * t), atol=1e-4)
    at_8k = model.encode_prompt([{"role": "user", "content": "x"}], {"audio": [(samples, 8000)]})
    at_16k = model.encode_prompt([{"role": "user", "content": "x"}], {"audio": [(up, 16000)]})
    torch.testing.assert_close(at_8k.media["audio_features"], at_16k.media["audio_features"])


def test_prompt_errors_say_what_to_do(model):
    with pytest.raises(ValueError, match="video is not supported"):
        model.encode_prompt([{"role": "user", "content": "x"}], {"videos": [[image(0)]]})
    two_parts = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "x"}]}]
    with pytest.raises(ValueError, match="2 \\{'type': 'image'\\} parts but media has 1"):
        model.encode_prompt(two_parts, {"images": [image(0)]})
    with pytest.raises(ValueError, match="sample_rate"):
        model.encode_prompt([{"role": "user", "content": "x"}], {"audio": [(audio(0.1)[0], 0)]})

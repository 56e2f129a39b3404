"""The causal-LM adapter on the tiny Qwen3: loading, LoRA in PEFT's format, the reference policy."""
import torch
from peft import PeftModel

from omni_rl.config.schema import ModelConfig
from omni_rl.models import build_model


def test_lora_saves_in_peft_format_and_loads_back(tmp_path):
    model = build_model(ModelConfig(adapter="Qwen3ForCausalLM", path="tiny:qwen3"), torch.device("cpu"))
    with torch.no_grad():
        for name, p in model.trainable_module().named_parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    model.save_lora(str(tmp_path / "lora"))
    assert (tmp_path / "lora" / "adapter_config.json").is_file()
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model.path)
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "lora"))
    ids = model.encode_prompt([{"role": "user", "content": "hello"}]).input_ids[None]
    mask = torch.ones_like(ids)
    torch.testing.assert_close(loaded(input_ids=ids, attention_mask=mask).logits.float(),
                               model.forward_logits(ids, mask)[0], atol=1e-5, rtol=0)


def test_reference_policy_is_the_base_model():
    model = build_model(ModelConfig(adapter="Qwen3ForCausalLM", path="tiny:qwen3"), torch.device("cpu"))
    ids = model.encode_prompt([{"role": "user", "content": "hello"}]).input_ids[None]
    mask = torch.ones_like(ids)
    before = model.forward_logits(ids, mask)[0]
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.05)
    after = model.forward_logits(ids, mask)[0]
    assert (after - before).abs().max() > 1e-4
    with model.reference_policy():
        ref = model.forward_logits(ids, mask)[0]
    torch.testing.assert_close(ref, before)
    # Only LoRA trains; the base weights are frozen.
    assert all("lora_" in n for n, p in model.trainable_module().named_parameters() if p.requires_grad)


def test_text_adapter_rejects_media():
    import pytest

    model = build_model(ModelConfig(adapter="Qwen3ForCausalLM", path="tiny:qwen3"), torch.device("cpu"))
    with pytest.raises(ValueError, match="omni adapter"):
        model.encode_prompt([{"role": "user", "content": "x"}], {"images": [object()]})


def test_gradient_checkpointing_gives_the_same_gradients():
    grads = []
    for checkpointing in (False, True):
        cfg = ModelConfig(adapter="Qwen3ForCausalLM", path="tiny:qwen3", gradient_checkpointing=checkpointing)
        torch.manual_seed(0)  # LoRA's A matrices are drawn at build time
        model = build_model(cfg, torch.device("cpu"))
        ids = model.encode_prompt([{"role": "user", "content": "hello there"}]).input_ids[None]
        seq = torch.cat([ids, torch.tensor([[97, 98, 99]])], 1)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.trainable_parameters():
                p.add_(0.01 * torch.randn_like(p))
        if checkpointing:
            # transformers only recomputes layers in training mode (their dropout is 0).
            layers = model.checkpointed_layers()
            assert layers and all(layer.training and layer.gradient_checkpointing for layer in layers)
        model.token_log_probs(seq, torch.ones_like(seq), ids.shape[1], 1.0).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.trainable_module().named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5, msg=name)


def test_logits_to_keep_gives_the_last_positions_alone():
    """A prefill asks for the last position only and the trainer for the response's: the same
    logits as the whole pass's tail (within float rounding: the head runs at another shape)."""
    model = build_model(ModelConfig(adapter="Qwen3ForCausalLM", path="tiny:qwen3"), torch.device("cpu"))
    ids = model.encode_prompt([{"role": "user", "content": "hello there"}]).input_ids[None].repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    with torch.no_grad():
        whole = model.forward_logits(ids, mask)[0]
        for keep in (1, 4):
            tail = model.forward_logits(ids, mask, logits_to_keep=keep)[0]
            assert tail.shape == (2, keep, whole.shape[-1])
            torch.testing.assert_close(tail, whole[:, -keep:], atol=1e-5, rtol=0)

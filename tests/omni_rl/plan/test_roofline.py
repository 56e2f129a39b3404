"""The roofline's byte counts, worked out by hand: the tiny Qwen3's decoding, MoE expert shares,
and a phase's bound."""
import math
from types import SimpleNamespace

import pytest

from omni_rl.compose import load_config
from omni_rl.plan.architecture import architecture_folder
from omni_rl.plan.devices import DEVICE_KINDS
from omni_rl.plan.planner import _spec
from omni_rl.plan.roofline import MoE, decode_bytes, moe_of
from omni_rl.plan.text_steps import DecodeReads, trace_text_step
from omni_rl.plan.weights import build_weightless


def test_the_tiny_qwen3s_decoding_reads_its_weights_once_a_step_and_the_kv_cache(tmp_path):
    cfg = load_config(["recipe=tiny_qwen3_grpo", f"trainer.output_dir={tmp_path}", "algo.family_options.max_prompt_tokens=4",
                       "rollout.sampling_options.max_new_tokens=8", "rollout.max_num_seqs=4"])
    built = build_weightless(cfg, architecture_folder(cfg.model.path))
    decode = trace_text_step(built.model, _spec(cfg), cfg).rollout.decode
    # tiny:qwen3 (adapters/qwen3.py): fp32, hidden 32, 2 layers, 4 query heads and 2 key-value heads
    # of 8, MLP 64, vocabulary 259, the output layer tied to the embedding. One layer's weights:
    # q 32x32 + k 32x16 + v 32x16 + o 32x32 = 3072, q/k norms 8 + 8, two RMS norms 32 + 32, MLP
    # gate, up 32x64 and down 64x32 = 6144: 9296. Two layers 18592, the final norm 32, the output
    # layer the whole table 259 x 32 = 8288, and the embedding lookup its B = 4 rows of 32 (128).
    vocab, batch, prompt = 259, 4, 4
    assert built.model.trainable_module().config.vocab_size == vocab
    per_step = 4 * (2 * 9296 + 32 + vocab * 32 + batch * 32)
    assert per_step == 108160
    assert decode.step == (per_step, 0)
    # The prefill reads the same weights, and the embedding rows of all B x P prompt tokens.
    assert decode.prefill == (per_step - 4 * batch * 32 + 4 * batch * prompt * 32, 0)
    # Keys and values: 2 layers x 2 x 2 heads x 8 x 4 bytes = 256 bytes a token and row, at P + R = 12.
    assert decode.cache_bytes == 256 * batch * 12


def test_decoding_bytes_sum_the_steps_and_the_growing_cache():
    # P = 2, R = 3, B = 1: the prefill (10 dense), then 3 steps of 4 dense bytes, over caches of
    # 3, 4 and 5 positions at 7 bytes a position (35 bytes at P + R = 5): 10 + 12 + 7 x 12 = 106.
    d = DecodeReads(batch=1, prompt=2, response=3, prefill=(10, 0), step=(4, 0), cache_bytes=35)
    assert decode_bytes(d, None) == pytest.approx(106)


def test_a_moe_reads_the_experts_its_tokens_route_to():
    moe = MoE(experts=128, top_k=8)
    assert moe.share(1) == pytest.approx(8 / 128)  # one token: its own 8 experts
    # 32 tokens: 1 - (120/128)^32 = 0.8728 of the experts, the Qwen3-Omni thinker's decoding batch.
    assert moe.share(32) == pytest.approx(1 - (120 / 128) ** 32) and 0.87 < moe.share(32) < 0.875
    assert moe.share(100_000) == pytest.approx(1.0)
    # Experts' bytes scale by the share; the dense bytes do not.
    d = DecodeReads(batch=32, prompt=1, response=1, prefill=(0, 0), step=(100, 1000), cache_bytes=0)
    assert decode_bytes(d, moe) == pytest.approx(100 + 1000 * moe.share(32) + 0 * moe.share(32))


def test_the_routing_comes_from_the_text_config():
    text = SimpleNamespace(num_experts=128, num_experts_per_tok=8)
    assert moe_of(SimpleNamespace(config=SimpleNamespace(text_config=text))) == MoE(128, 8)
    assert moe_of(SimpleNamespace(config=SimpleNamespace(hidden_size=8))) is None


def test_every_device_kind_has_a_bandwidth():
    for kind in DEVICE_KINDS.values():
        assert 0 < kind.memory_tbps < 10 and math.isfinite(kind.bf16_tflops)

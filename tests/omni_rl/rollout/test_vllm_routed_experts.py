"""The vLLM text engine's routed experts without vLLM: who records them (`route_capture`, from an
`EngineArgs` dataclass with and without `enable_return_routed_experts`), its start-up line, and
how a completion's rows become `TextResult.routes` (`routes_of_completion`)."""
from dataclasses import dataclass

import pytest
import torch

from omni_rl.models.autoregressive import PromptInputs
from omni_rl.models.moe_routing import RouterLayout, RoutingReplayError
from omni_rl.rollout.text_types import TextRequest
from omni_rl.rollout.vllm_omni.text_engine import (
    EXTENSION_CAPTURES, VLLM_RETURNS, route_capture, routed_experts_line, routes_of_completion)


@dataclass
class WithRoutes:
    model: str = "x"
    enable_return_routed_experts: bool = False


@dataclass
class WithoutRoutes:
    model: str = "x"


def test_vllm_returns_routes_only_from_its_v2_runner_else_the_extension_captures_them():
    assert route_capture(WithRoutes, has_triton=True, v2_runner_env=None) == VLLM_RETURNS
    assert route_capture(WithRoutes, has_triton=False, v2_runner_env=None) == EXTENSION_CAPTURES  # vLLM's CPU build
    assert route_capture(WithRoutes, has_triton=True, v2_runner_env=False) == EXTENSION_CAPTURES
    assert route_capture(WithoutRoutes, has_triton=True, v2_runner_env=None) == EXTENSION_CAPTURES
    assert routed_experts_line("0.32.0", VLLM_RETURNS).startswith("vLLM 0.32.0 returns the routed experts")
    line = routed_experts_line("0.32.0", EXTENSION_CAPTURES)
    assert line.startswith("vLLM 0.32.0 cannot return routed experts here") and "prefix caching off" in line


LAYOUT = RouterLayout(num_layers=2, num_experts=8, top_k=2, norm_topk_prob=True)


def request(prompt_len: int) -> TextRequest:
    ids = torch.arange(prompt_len)
    return TextRequest(prompt=PromptInputs(input_ids=ids), seed=0, max_new_tokens=4, record_routes=True,
                       request_id=7)


def test_a_completions_rows_become_the_moe_layers_routes_of_the_fed_tokens():
    # vLLM's own rows: every decoder layer (3, of which 0 and 2 route), one more token than fed.
    rows = torch.randint(0, 8, (5 + 3, 3, 2), dtype=torch.int32)
    routes = routes_of_completion(request(5), rows, response_len=3, moe_layers=[0, 2], layout=LAYOUT)
    assert routes.dtype == torch.uint8 and routes.shape == (5 + 3 - 1, 2, 2)
    assert torch.equal(routes.long(), rows[:7, [0, 2]].long())


def test_a_short_or_unrecorded_or_foreign_recording_is_one_error_naming_the_request():
    rows = torch.randint(0, 8, (7, 2, 2), dtype=torch.int32)
    with pytest.raises(RoutingReplayError, match=r"request 7: vLLM returned routes for 6 tokens, expected 7"):
        routes_of_completion(request(5), rows[:6], 3, [0, 1], LAYOUT)
    with pytest.raises(RoutingReplayError, match=r"request 7: vLLM returned no routes"):
        routes_of_completion(request(5), None, 3, [0, 1], LAYOUT)
    holes = rows.clone()
    holes[4, 1] = -1
    with pytest.raises(RoutingReplayError, match=r"request 7: vLLM recorded no route at token 4 of 7"):
        routes_of_completion(request(5), holes, 3, [0, 1], LAYOUT)
    with pytest.raises(RoutingReplayError, match=r"request 7: expert index 9 in the routes, expected 0 \.\. 7"):
        routes_of_completion(request(5), rows.clone().fill_(9), 3, [0, 1], LAYOUT)
    with pytest.raises(RoutingReplayError, match=r"MoE layers \[0, 2\]"):
        routes_of_completion(request(5), rows, 3, [0, 2], LAYOUT)


def test_full_weights_go_to_vllm_as_the_checkpoint_names_them_experts_unfused():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from omni_rl.rollout.vllm_omni.text_engine import checkpoint_named

    config = Qwen3MoeConfig(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            num_experts=4, num_experts_per_tok=2)
    # The rollout server's view holds no weights: the names and layouts come from the model's class.
    with torch.device("meta"):
        view = Qwen3MoeForCausalLM(config)
    gen = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(p.shape, generator=gen) for n, p in view.named_parameters()}
    fused = tensors["model.layers.0.mlp.experts.gate_up_proj"]  # [experts, 2 x intermediate, hidden] in memory
    named = checkpoint_named(view, tensors)
    assert "model.layers.0.mlp.experts.gate_up_proj" not in named
    half = fused.shape[1] // 2
    assert torch.equal(named["model.layers.0.mlp.experts.3.gate_proj.weight"], fused[3, :half])
    assert torch.equal(named["model.layers.0.mlp.experts.3.up_proj.weight"], fused[3, half:])
    assert torch.equal(named["model.embed_tokens.weight"], tensors["model.embed_tokens.weight"])


def test_routes_cross_the_rollout_servers_protocol_in_their_own_dtype():
    from omni_rl.rollout.server.protocol import decode_message, encode_message
    from omni_rl.rollout.text_types import TextResult

    routes = torch.randint(0, 8, (6, 2, 2), dtype=torch.uint8)
    sent = TextResult(request_id=3, prompt=request(4).prompt, response_ids=torch.tensor([1, 2, 3]),
                      log_probs=torch.zeros(3), finish_reason="stop", text="abc", temperature=1.0, routes=routes)
    (got,) = decode_message(encode_message({"results": [sent]}))["results"]
    assert got.routes.dtype == torch.uint8 and torch.equal(got.routes, routes)

"""`omni_rl.models.moe_routing` on transformers' own Qwen3-MoE router (a tiny config): the
replayed gate weights are the router's own where the experts are its own, the hooks replay and
record, a recording that does not fit is refused, and the load-balancing loss counts the given
routes (hand-worked values)."""
import math

import pytest
import torch

from omni_rl.models.moe_routing import (
    RouterHooks, RouterLayout, RoutingReplayError, differing_tokens, load_balancing_loss, replayed_gate, route_dtype,
)


def router(norm_topk_prob=True):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    torch.manual_seed(0)
    module = Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=16, num_experts=6, num_experts_per_tok=2,
                                               norm_topk_prob=norm_topk_prob))
    torch.nn.init.normal_(module.weight, std=0.5)
    return module


def test_route_dtype_is_the_smallest_that_holds_the_experts():
    assert route_dtype(8) == torch.uint8 and route_dtype(256) == torch.uint8  # index 255 fits a byte
    assert route_dtype(257) == torch.int16 and route_dtype(2**15) == torch.int16
    assert route_dtype(2**15 + 1) == torch.int32


@pytest.mark.parametrize("norm", [True, False])
def test_replayed_gate_of_the_routers_own_top_k_is_its_own_weights(norm):
    r = router(norm)
    h = torch.randn(10, 16)
    logits, weights, indices = r(h)
    torch.testing.assert_close(replayed_gate(logits, indices, norm), weights, rtol=0, atol=0)


def test_hooks_replay_given_experts_with_the_routers_weights_and_record_them():
    r = router()
    hooks = RouterHooks([r])
    h = torch.randn(5, 16)
    own_logits, _, own = r(h)
    replay = torch.tensor([[0, 1], [2, 3], [4, 5], [0, 5], [1, 2]])
    mask = torch.tensor([True, True, True, True, False])  # the last token keeps its own experts
    with hooks.recording() as layers, hooks.replaying(replay[None], mask):
        logits, weights, indices = r(h)
    expected = torch.where(mask[:, None], replay, own)
    assert torch.equal(indices, expected) and torch.equal(layers[0][0], expected)
    # softmax over all six experts, gathered at the replayed two, renormalised over them
    probs = torch.softmax(own_logits, -1)
    picked = probs.gather(-1, expected)
    torch.testing.assert_close(weights, picked / picked.sum(-1, keepdim=True))
    assert torch.equal(logits, own_logits)  # the logits (and their gradient path) are the router's
    _, _, after = r(h)
    assert torch.equal(after, own)  # the replay ended with its block


def test_a_replay_for_another_token_count_is_refused():
    r = router()
    RouterHooks([r]).set_replay(torch.zeros(1, 4, 2, dtype=torch.long))
    with pytest.raises(RoutingReplayError, match="routes for 4 tokens, but MoE layer 0's forward has 5"):
        r(torch.randn(5, 16))


def test_layout_check_names_what_does_not_fit():
    layout = RouterLayout(num_layers=2, num_experts=8, top_k=2, norm_topk_prob=True)
    layout.check(torch.zeros(7, 2, 2, dtype=torch.uint8), "sample 0")
    with pytest.raises(RoutingReplayError, match=r"sample 3: routes of shape \(7, 3, 2\), expected \[tokens, 2 MoE layers"):
        layout.check(torch.zeros(7, 3, 2, dtype=torch.uint8), "sample 3")
    bad = torch.zeros(7, 2, 2, dtype=torch.uint8)
    bad[4, 1, 0] = 8
    with pytest.raises(RoutingReplayError, match="sample 1: expert index 8 in the routes, expected 0 .. 7"):
        layout.check(bad, "sample 1")


def test_differing_tokens_compares_expert_sets_over_layers():
    a = torch.tensor([[[0, 1], [2, 3]], [[0, 1], [2, 3]], [[0, 1], [2, 3]]])
    b = torch.tensor([[[1, 0], [3, 2]], [[0, 1], [2, 4]], [[5, 1], [2, 3]]])  # same set; layer 1; layer 0
    assert differing_tokens(a, b, torch.tensor([True, True, False])).tolist() == [False, True, False]


def test_load_balancing_counts_the_given_routes():
    # Two experts, probabilities (3/4, 1/4) for both tokens (logits log 3 and 0), top-1.
    logits = [torch.tensor([[math.log(3.0), 0.0], [math.log(3.0), 0.0]])]
    # Both tokens to expert 0: shares (1, 0) -> 2 * (1 * 3/4) = 1.5 (the router's own top-1).
    assert float(load_balancing_loss(logits, [torch.tensor([[0], [0]])])) == pytest.approx(1.5)
    # Replayed to experts 0 and 1: shares (1/2, 1/2) -> 2 * (3/8 + 1/8) = 1.0.
    assert float(load_balancing_loss(logits, [torch.tensor([[0], [1]])])) == pytest.approx(1.0)
    # Both replayed to expert 1: 2 * (1 * 1/4) = 0.5; a masked token does not count.
    assert float(load_balancing_loss(logits, [torch.tensor([[1], [1]])])) == pytest.approx(0.5)
    assert float(load_balancing_loss(logits, [torch.tensor([[1], [0]])], torch.tensor([1.0, 0.0]))) == pytest.approx(0.5)

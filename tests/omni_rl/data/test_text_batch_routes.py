"""Recorded routes travel with a text trajectory: a result's routes land in the batch's columns
(left-padded prompts), `select` keeps them with their rows, the rollout server's protocol and
Ray's pickling carry them in their compact type, and results of two models do not mix."""
import pickle

import pytest
import torch

from omni_rl.data.text_batch import TextBatch
from omni_rl.models.autoregressive import PromptInputs
from omni_rl.models.moe_routing import RoutingReplayError
from omni_rl.rollout.server.protocol import decode_message, encode_message
from omni_rl.rollout.text_types import TextResult


def result(prompt_len: int, response_len: int, first: int, layers: int = 2, k: int = 2) -> TextResult:
    fed = prompt_len + response_len - 1  # the last response token is fed to no forward
    routes = (torch.arange(fed * layers * k).view(fed, layers, k) + first) % 8
    return TextResult(
        request_id=first, prompt=PromptInputs(torch.arange(prompt_len)), response_ids=torch.arange(response_len),
        log_probs=torch.zeros(response_len), finish_reason="length", text="x", temperature=1.0,
        routes=routes.to(torch.uint8),
    )


def test_routes_land_in_the_batch_columns_and_follow_select():
    results = [result(3, 2, 0), result(5, 4, 1)]
    batch = TextBatch.from_results(results, ["a", "b"], [{}, {}], [0, 1], pad_id=0)
    assert batch.sequences.shape == (2, 9) and batch.routes.shape == (2, 9, 2, 2)
    assert batch.routes.dtype == torch.uint8
    # Sample 0: prompt in columns 2..4, first response token in 5; sample 1: columns 0..7.
    assert batch.route_mask.tolist() == [[False, False, True, True, True, True, False, False, False],
                                         [True] * 8 + [False]]
    assert torch.equal(batch.routes[0, 2:6], results[0].routes)
    assert torch.equal(batch.routes[1, :8], results[1].routes)
    picked = batch.select([1])
    assert torch.equal(picked.routes[0], batch.routes[1]) and torch.equal(picked.route_mask[0], batch.route_mask[1])


def test_a_result_without_routes_has_an_empty_mask_row():
    results = [result(3, 2, 0), TextResult(**{**result(3, 2, 1).__dict__, "routes": None})]
    batch = TextBatch.from_results(results, ["a", "b"], [{}, {}], [0, 1], pad_id=0)
    assert batch.route_mask[0].any() and not batch.route_mask[1].any()
    dense = [TextResult(**{**r.__dict__, "routes": None}) for r in results]
    assert TextBatch.from_results(dense, ["a", "b"], [{}, {}], [0, 1], pad_id=0).routes is None


def test_results_of_two_models_do_not_mix():
    with pytest.raises(RoutingReplayError, match=r"sample 1: routes of shape \(4, 3, 2\)"):
        TextBatch.from_results([result(3, 2, 0), result(3, 2, 1, layers=3)], ["a", "b"], [{}, {}], [0, 1], pad_id=0)


def test_the_protocol_and_pickling_carry_routes_compactly():
    sent = result(4, 3, 5)
    for received in (decode_message(encode_message([sent]))[0], pickle.loads(pickle.dumps(sent))):
        assert received.routes.dtype == torch.uint8 and torch.equal(received.routes, sent.routes)

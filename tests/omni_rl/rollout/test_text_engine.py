"""The native text engine on the tiny Qwen3: per-request sampling, alignment with the trainer."""
import torch
import pytest

from omni_rl.config.schema import ModelConfig
from omni_rl.models import build_model
from omni_rl.rollout.text_native import NativeTextEngine
from omni_rl.rollout.text_types import TextRequest


@pytest.fixture(scope="module")
def qwen3():
    return build_model(ModelConfig(adapter="Qwen3ForCausalLM", path="tiny:qwen3"), torch.device("cpu"))


def requests(model, n, max_new_tokens=12, **kw):
    prompts = ["hi", "what is 2+2?", "name a colour", "a"]
    return [
        TextRequest(prompt=model.encode_prompt([{"role": "user", "content": prompts[i % 4]}]), seed=100 + i,
                    max_new_tokens=max_new_tokens, **kw)
        for i in range(n)
    ]


def test_a_response_is_the_same_alone_or_batched(qwen3):
    reqs = requests(qwen3, 8)
    batched = NativeTextEngine(qwen3, max_num_seqs=8).generate(reqs)
    alone = NativeTextEngine(qwen3, max_num_seqs=1).generate(reqs)
    for a, b in zip(batched, alone):
        assert torch.equal(a.response_ids, b.response_ids)
        torch.testing.assert_close(a.log_probs, b.log_probs, atol=1e-5, rtol=0)
    # Different seeds explore: not every response is the same.
    assert len({tuple(r.response_ids.tolist()) for r in batched}) > 1


def test_rollout_log_probs_match_the_trainers(qwen3):
    results = NativeTextEngine(qwen3, max_num_seqs=8).generate(requests(qwen3, 8, temperature=0.7))
    rollout, recomputed = [], []
    for r in results:
        seq = torch.cat([r.prompt.input_ids, r.response_ids])[None]
        lp = qwen3.token_log_probs(seq, torch.ones_like(seq), len(r.prompt.input_ids), 0.7)[0]
        rollout.append(r.log_probs)
        recomputed.append(lp.detach())
    a, b = torch.cat(rollout), torch.cat(recomputed)
    assert (a - b).abs().max() <= 1e-4
    assert torch.corrcoef(torch.stack([a, b]))[0, 1] >= 0.999


def test_stop_tokens_and_truncation(qwen3):
    # With every token a stop token the first sampled token stops the response.
    stop_all = tuple(range(len(qwen3.tokenizer)))
    results = NativeTextEngine(qwen3).generate(requests(qwen3, 4, stop_token_ids=stop_all))
    for r in results:
        assert r.finish_reason == "stop" and len(r.response_ids) == 1
    long = NativeTextEngine(qwen3).generate(requests(qwen3, 4, max_new_tokens=3))
    for r in long:
        assert len(r.response_ids) <= 3
        assert r.finish_reason == ("stop" if r.response_ids[-1].item() in qwen3.eos_token_ids else "length")


def test_top_p_limits_what_is_sampled(qwen3):
    # A tiny top_p keeps only the most likely token: sampling becomes greedy.
    results = NativeTextEngine(qwen3).generate(requests(qwen3, 4, max_new_tokens=4, top_p=1e-6))
    for r in results:
        seq = r.prompt.input_ids[None]
        logits, _ = qwen3.forward_logits(seq, torch.ones_like(seq))
        assert r.response_ids[0].item() == int(logits[0, -1].argmax())


def test_bad_sampling_settings_raise(qwen3):
    with pytest.raises(ValueError, match="temperature"):
        NativeTextEngine(qwen3).generate(requests(qwen3, 1, temperature=-0.5))


def test_temperature_zero_is_greedy_whatever_the_seed(qwen3):
    reqs = requests(qwen3, 4, max_new_tokens=4, temperature=0.0)
    results = NativeTextEngine(qwen3).generate(reqs)
    for r in results:
        seq = r.prompt.input_ids[None]
        logits, _ = qwen3.forward_logits(seq, torch.ones_like(seq))
        # The first token is the argmax after the prompt; its log-prob is of the untempered distribution.
        assert r.response_ids[0].item() == int(logits[0, -1].argmax())
        assert r.log_probs[0].item() == pytest.approx(torch.log_softmax(logits[0, -1].float(), -1).max().item(), abs=1e-4)
    other_seeds = [TextRequest(prompt=r.prompt, seed=r.seed + 1000, max_new_tokens=4, temperature=0.0) for r in reqs]
    again = NativeTextEngine(qwen3).generate(other_seeds)
    assert [a.response_ids.tolist() for a in again] == [r.response_ids.tolist() for r in results]


def test_no_forward_holds_more_than_the_last_positions_logits(qwen3, monkeypatch):
    """The prefill (and every decoding step) returns the last position's logits only: a long
    prompt's full-vocabulary logits are never materialised (the largest tensor of a real prefill)."""
    widths = []
    forward = qwen3.forward_logits

    def recording(*args, **kwargs):
        logits, cache = forward(*args, **kwargs)
        widths.append(logits.shape[1])
        return logits, cache

    monkeypatch.setattr(qwen3, "forward_logits", recording)  # the instance's attribute: a recorder around it
    results = NativeTextEngine(qwen3).generate(requests(qwen3, 3, max_new_tokens=4))
    assert results and widths and set(widths) == {1}

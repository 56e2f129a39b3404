"""The agent family on the tiny tools Qwen3 (random weights): multi-turn trajectories through the
native engine's KV cache, masked tool / environment turns, and the on-policy checks of issue 41.

The random model never writes a tool call, so the `guess_number` environment makes the turns:
it answers every model turn until agent.max_turns."""
from __future__ import annotations

import re

import pytest
import torch

from omni_rl.algos.token_losses import TokenLossInput
from omni_rl.compose import load_config
from omni_rl.data.prompts import PromptItem
from omni_rl.errors import ConfigError
from omni_rl.families.base import build_family
from omni_rl.models.factory import build_model
from omni_rl.rollout.backends import build_rollout_engine
from tests.omni_rl.agent.encoded_tokens import counting_encoded_tokens

BASE = ["recipe=tiny_qwen3_calculator_agent", "model.path=tiny:qwen3_tools", "algo.family_options.agent_options.environment=guess_number",
        "algo.family_options.agent_options.max_turns=3", "algo.family_options.agent_options.max_total_tokens=160", "algo.family_options.agent_options.environment_options.high=1000000", "rollout.sampling_options.max_new_tokens=6",
        "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.mini_batch_size=4",
        "trainer.micro_batch_size=4"]


@pytest.fixture(scope="module")
def rolled():
    cfg = load_config(BASE)
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    family = build_family(cfg, model)
    engine = build_rollout_engine(cfg, model)
    with counting_encoded_tokens(model) as fed:
        batch, _ = family.rollout(engine, [PromptItem("7*8", {"secret": 777777}), PromptItem("3*4", {"secret": 888888})],
                                  step=1)
    return cfg, model, family, batch, torch.stack(fed).sum(0)


def test_the_trajectories_hold_fed_turns_masked_out(rolled):
    _, model, family, batch, _ = rolled
    assert type(family).__name__ == "AgentFamily"
    response = batch.attention_mask[:, batch.prompt_width:].bool()
    fed = response & ~batch.response_mask.bool()
    assert fed.any(1).all(), "every trajectory has an environment turn"
    for i, meta in enumerate(batch.metadata):
        t = meta["trajectory"]
        assert t["finish_reason"] in ("max_turns", "max_total_tokens", "environment")
        assert t["model_turns"] >= 1 and len(t["turn_rewards"]) == t["model_turns"]
        # The fed tokens are the template's user turns, each opening the next assistant turn; a model
        # turn cut at max_new_tokens is closed by a fed <|im_end|> first.
        text = model.tokenizer.decode(batch.sequences[i, batch.prompt_width:][fed[i]].tolist())
        turns = re.findall(r"(?:<\|im_end\|>)?\n<\|im_start\|>user\n(.*?)<\|im_end\|>\n<\|im_start\|>assistant\n", text)
        assert len(turns) == t["model_turns"] - (t["finish_reason"] != "environment")
        assert all(turn in ("higher", "lower") or turn.startswith("Guess a whole number") for turn in turns)
    assert (batch.rollout_log_probs[fed] == 0).all()


def test_no_prefix_is_encoded_twice(rolled):
    _, _, _, batch, fed_per_row = rolled
    # Each row's prompt and response tokens went through the model at most once over all forwards,
    # and all of them but the last: a trajectory's last token is fed only when its session has not
    # yet said it is done by the next forward (the sessions answer in threads, so that is timing).
    tokens = batch.attention_mask.sum(1)
    assert (fed_per_row <= tokens).all() and (fed_per_row >= tokens - 1).all(), (fed_per_row, tokens)


def test_rollout_and_trainer_log_probs_agree_on_model_tokens(rolled):
    _, _, family, batch, _ = rolled
    old = family.behaviour_policy(batch, micro_batch_size=4)
    mask = batch.response_mask.bool()
    assert torch.equal(old.mask, batch.response_mask)
    gap = (old.log_probs - batch.rollout_log_probs)[mask].abs().max()
    assert gap <= 1e-5, float(gap)
    # On-policy, the first mini-batch's forward is the old policy's: the ratio is exactly 1.
    ratio = torch.exp(family.log_probs(batch) - old.log_probs)[mask]
    assert torch.equal(ratio, torch.ones_like(ratio))


def test_the_loss_has_no_gradient_from_fed_tokens(rolled):
    _, _, family, batch, _ = rolled
    log_prob = torch.randn(batch.response_mask.shape, requires_grad=True)
    loss, _ = family.policy_loss(TokenLossInput(
        log_prob=log_prob, old_log_prob=log_prob.detach() + 0.05, advantages=torch.linspace(-1, 1, len(batch))[:, None],
        mask=batch.response_mask, ref_log_prob=None, rollout_is_weight=None))
    loss.backward()
    model_tokens = batch.response_mask.bool()
    assert (log_prob.grad[~model_tokens] == 0).all()
    assert (log_prob.grad[model_tokens] != 0).any()


def test_the_whole_loss_ignores_what_the_fed_tokens_predict(rolled):
    _, model, family, batch, _ = rolled
    micro = batch.select(range(len(batch)))
    micro.old_log_probs = family.behaviour_policy(micro, 4).log_probs
    micro.advantages = torch.linspace(-1, 1, len(micro))
    loss, _ = family.loss(micro, 0)
    # Garbage in every stored value at the fed positions changes nothing.
    fed = ~micro.response_mask.bool()
    micro.old_log_probs = micro.old_log_probs.masked_fill(fed, 7.0)
    loss_again, _ = family.loss(micro, 0)
    assert torch.equal(loss, loss_again)


def test_the_sample_log_holds_whole_conversations(rolled, tmp_path):
    import json

    from omni_rl.families.agent import write_conversations
    from omni_rl.agent.trajectory import Trajectory

    _, _, _, batch, _ = rolled
    t = batch.metadata[0]["trajectory"]
    path = tmp_path / "s.jsonl"
    write_conversations(path, [Trajectory(prompt="7*8", **{k: t[k] for k in (
        "messages", "turn_rewards", "model_turns", "finish_reason", "env_return")})])
    row = json.loads(path.read_text())
    assert [m["role"] for m in row["messages"]][:3] == ["system", "user", "assistant"] or \
        [m["role"] for m in row["messages"]][:2] == ["user", "assistant"]
    assert row["finish_reason"] == t["finish_reason"]


@pytest.mark.parametrize("override, message", [
    ("algo.family_options.agent_options.tools=[{name: abacus}]", "algo.family_options.agent_options.tools[0].name='abacus': unknown tool; registered:"),
    ("algo.family_options.agent_options.max_turns=0", "algo.family_options.agent_options.max_turns=0: expected an integer >= 1"),
    ("algo.family_options.agent_options.turn_reward=mean", "algo.family_options.agent_options.turn_reward='mean': expected one of sum, discounted"),
    ("algo.family_options.agent_options.environment=maze", "algo.family_options.agent_options.environment='maze': unknown environment; registered:"),
    ("algo.family_options.agent_options.tools=[{name: calculator, tool_options: {max_exponent: 0}}]", "algo.family_options.agent_options.tools[0].tool_options"),
    ("algo.family_options.agent_options.tool_timeout_s=0", "algo.family_options.agent_options.tool_timeout_s=0.0: expected a finite number of seconds > 0"),
    ("algo.family_options.agent_options.max_total_tokens=4", "rollout.sampling_options.max_new_tokens=64 is over algo.family_options.agent_options.max_total_tokens=4"),
])
def test_bad_agent_config_is_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(["recipe=tiny_qwen3_calculator_agent", override])
    assert "\n" not in str(err.value) and str(err.value).startswith(message), str(err.value)


def test_the_prompt_limit_leaves_room_for_the_whole_trajectory(rolled):
    _, model, family, _, _ = rolled
    context = model.context_length()
    # The prompt may take what the trajectory's budget (160 here) leaves, not what a turn's does.
    assert family.prompt_token_limit == context - 160

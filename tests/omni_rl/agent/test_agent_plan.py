"""`--plan` counts an agent's longest trajectory (every turn) as the response it traces."""
from omni_rl.compose import load_config
from omni_rl.plan.text_steps import text_lengths, text_trajectory_bytes, TRAJECTORY_BYTES_PER_TOKEN


def test_the_plan_traces_the_longest_trajectory():
    agent = load_config(["recipe=tiny_qwen3_calculator_agent", "algo.family_options.max_prompt_tokens=600",
                         "algo.family_options.agent_options.max_total_tokens=300"])
    assert text_lengths(agent) == (600, 300)  # not max_new_tokens=64: a model turn
    assert text_trajectory_bytes(agent) == 900 * TRAJECTORY_BYTES_PER_TOKEN
    plain = load_config(["recipe=tiny_qwen3_grpo", "algo.family_options.max_prompt_tokens=600"])
    assert text_lengths(plain) == (600, 16)

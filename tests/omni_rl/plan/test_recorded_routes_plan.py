"""The plan counts a sample's recorded routes (tokens x MoE layers x top_k, one byte each for the
tiny Qwen3-MoE's 8 experts) in its stored trajectory under routing_replay=r3, and nothing for
them otherwise or for a dense model."""
import torch

from omni_rl.compose import load_config
from omni_rl.models import build_model
from omni_rl.plan.text_steps import TRAJECTORY_BYTES_PER_TOKEN, recorded_route_bytes, text_trajectory_bytes

SIZES = ["algo.family_options.max_prompt_tokens=100", "rollout.sampling_options.max_new_tokens=16"]


def test_recorded_routes_are_counted_under_r3_only():
    cfg = load_config(["recipe=tiny_qwen3_moe_grpo", *SIZES])
    model = build_model(cfg.model, torch.device("cpu"))
    tokens = 100 + 16
    assert recorded_route_bytes(cfg, model) == tokens * 2 * 2 * 1  # 2 MoE layers x top-2, uint8
    assert text_trajectory_bytes(cfg, model) == tokens * (TRAJECTORY_BYTES_PER_TOKEN + 4)
    off = load_config(["recipe=tiny_qwen3_moe_grpo", "algo.family_options.routing_replay=off", *SIZES])
    assert recorded_route_bytes(off, model) == 0 and text_trajectory_bytes(off, model) == tokens * TRAJECTORY_BYTES_PER_TOKEN
    dense = load_config(["recipe=tiny_qwen3_grpo", *SIZES])
    assert recorded_route_bytes(dense, build_model(dense.model, torch.device("cpu"))) == 0

"""The vLLM text engine's start-up line on routed experts, from a `ModelConfig` dataclass with
and without vLLM 0.30.0's `enable_return_routed_experts` field (no vLLM needed)."""
from dataclasses import dataclass

from omni_rl.rollout.vllm_omni.text_engine import routed_experts_line


@dataclass
class WithRoutes:
    model: str = "x"
    enable_return_routed_experts: bool = False


@dataclass
class WithoutRoutes:
    model: str = "x"


def test_the_line_says_whether_vllm_can_return_routed_experts():
    assert routed_experts_line("0.30.0", WithRoutes).startswith("vLLM 0.30.0 can return routed experts")
    line = routed_experts_line("0.11.0", WithoutRoutes)
    assert line.startswith("vLLM 0.11.0 cannot return routed experts") and "rollout.backend=native" in line

"""The `draw` tool samples a frozen tiny diffusion model and the `judge` tool scores its image with
a registered reward (issue 41's thin image tools), both through the tool runner."""
from __future__ import annotations

import pytest

from omni_rl.agent import TOOLS
from omni_rl.agent.components import ToolCall
from omni_rl.agent.runner import ToolRunner
from omni_rl.config.options import bind_options


@pytest.mark.long  # builds tiny:sd3 (about a minute on a loaded 2-core machine)
def test_draw_then_judge_on_tiny_sd3():
    import agent_tools  # noqa: F401  (registers the tools)

    draw_cls, judge_cls = TOOLS.get("draw"), TOOLS.get("judge")
    draw = draw_cls(bind_options(draw_cls.Options, {
        "recipe": "tiny_sd3_flowgrpo", "overrides": ["rollout.sampling_options.num_steps=2", "rollout.sampling_options.sde_window_size=0", "rollout.sampling_options.sde_window_range=null", "rollout.sampling_options.height=64", "rollout.sampling_options.width=64"],
        "reward": "jpeg_compressibility"}, "agent.tools[0].tool_options", "tool draw"))
    judge = judge_cls(bind_options(judge_cls.Options, {"reward": "jpeg_compressibility"},
                                   "agent.tools[1].tool_options", "tool judge"))
    runner = ToolRunner({"draw": draw, "judge": judge}, timeout_s=600, max_output_chars=200)
    drawn = runner.run(ToolCall("draw", {"prompt": "a red circle"}))
    assert drawn.ok, drawn.observation
    key = drawn.observation.split(":")[0]
    assert key.startswith("img-") and "jpeg_compressibility score" in drawn.observation
    judged = runner.run(ToolCall("judge", {"image": key}))
    assert judged.ok and judged.observation.startswith(f"{key}: jpeg_compressibility ")
    # The same image, the same reward: the judge's score is the one draw reported.
    assert abs(judged.score - drawn.score) < 1e-6
    missing = runner.run(ToolCall("judge", {"image": "img-999999"}))
    assert missing.observation.startswith("error: no image 'img-999999'")

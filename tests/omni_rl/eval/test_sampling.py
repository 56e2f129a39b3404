"""omni_rl/eval/sampling.py: the samplers' registry, the fields each reads and the recipe's values (no model loads)."""
import pytest

from omni_rl.compose import load_config
from omni_rl.eval.benchmark import Benchmark, Metric, PromptSource
from omni_rl.eval.protocol import Protocol, ScorerSpec
from omni_rl.eval.sampling import SAMPLERS


def test_one_sampler_per_family_each_filling_its_own_fields_from_the_recipe():
    assert {"diffusion", "autoregressive", "talker"} <= set(SAMPLERS.names())
    image = SAMPLERS.get("diffusion").recipe_values(load_config(["recipe=tiny_sd3_shapes_counting"]))
    assert set(image) == {"num_steps", "guidance_scale", "height", "width"}  # an image names no frames
    video = SAMPLERS.get("diffusion").recipe_values(load_config(["recipe=tiny_wan22_flowgrpo"]))
    assert (video["num_frames"], video["fps"], video["num_steps"]) == (5, 16, 8)
    text = SAMPLERS.get("autoregressive").recipe_values(load_config(["recipe=tiny_qwen3_grpo"]))
    assert text == {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 16}
    speech = SAMPLERS.get("talker").recipe_values(load_config(["recipe=tiny_qwen3_omni_talker_grpo"]))
    assert (speech["max_new_tokens"], speech["speech_temperature"], speech["max_frames"]) == (6, 1.0, 16)
    # A sampler fills only fields it reads.
    for family, values in (("diffusion", video), ("autoregressive", text), ("talker", speech)):
        assert set(values) <= set(SAMPLERS.get(family).fields), family


def test_a_benchmark_of_a_family_without_a_sampler_is_refused():
    with pytest.raises(ValueError, match="family='think_draw', expected a family with an evaluation sampler"):
        Benchmark("x", "think_draw", "", PromptSource("txt", "here"), Protocol(1, scorers=(ScorerSpec("ocr"),)),
                  (Metric("m", "ocr"),), "m")


def test_a_scorers_video_frames_survives_overrides_and_the_round_trip():
    p = Protocol(1, scorers=(ScorerSpec("clip_score", video_frames=8), ScorerSpec("ocr")))
    changed = p.with_overrides(["clip_score.model=tiny:clip-reward"])
    assert changed.scorers[0] == ScorerSpec("clip_score", (("model", "tiny:clip-reward"),), 8)
    assert Protocol.from_dict(changed.to_dict()) == changed
    # An image scorer's entry reads as it did before frames existed.
    assert changed.to_dict()["scorers"][1] == {"reward": "ocr", "kwargs": {}}

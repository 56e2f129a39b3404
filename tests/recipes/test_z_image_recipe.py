"""The tiny Z-Image recipe trains end to end, as a user runs it (a subprocess of main_omni.py),
with the rollout's and the trainer's log-probs the same function (ratio 1 on the first
mini-batch, gap <= 1e-5: `recipe_runs.train`) and the LoRA left in diffusers' format.

Its whole learning run (the Z-Image family's one in the default run) is judged like the other
tiny recipes: the mean reward of the last 20% of steps beats the first 20% by more than 3
standard errors (`rise_report`), and the LoRA it trained, loaded by
`ZImagePipeline.load_lora_weights`, brightens the pipeline's images as it brightened the
adapter's."""
import pytest

from omni_rl.logging import rise_report
from tests.recipes.recipe_runs import brightness_before_and_after_lora, train


def run(out, *overrides: str) -> list[dict]:
    steps = train(out, "tiny_z_image_flowgrpo", *overrides)
    assert (out / "lora" / "pytorch_lora_weights.safetensors").is_file()
    return steps


@pytest.mark.slow
def test_tiny_z_image_flowgrpo_learns(tmp_path):
    out = tmp_path / "z_image"
    steps = run(out)
    assert len(steps) == 40
    assert (out / "samples" / "val_step_000040.png").is_file()
    report = rise_report(out / "metrics.jsonl")
    assert report["rose"], report

    from diffusers import ZImagePipeline

    # The recipe's validation: 12 steps, no CFG (the pipeline's scale is ours - 1).
    before, after = brightness_before_and_after_lora(ZImagePipeline, "z_image", out / "lora", height=32, width=32,
                                                     num_inference_steps=12, guidance_scale=0.0, max_sequence_length=64)
    assert after > before

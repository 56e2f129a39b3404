"""The tiny Z-Image recipe trains end to end, as a user runs it (a subprocess of main_omni.py),
with the rollout's and the trainer's log-probs the same function (ratio 1 on the first
mini-batch, gap <= 1e-5: `recipe_runs.train`) and the LoRA left in diffusers' format.

Its whole learning run (the Z-Image family's one in the default run) is judged like the other
tiny recipes: the mean reward of the last 20% of steps beats the first 20% by more than 3
standard errors (`rise_report`), and the LoRA it trained, loaded by
`ZImagePipeline.load_lora_weights`, brightens the pipeline's images as it brightened the
adapter's."""
import pytest
import torch

from omni_rl.logging import rise_report
from omni_rl.models.loading import resolve_model_path
from tests.recipes.recipe_runs import train


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

    pipe = ZImagePipeline.from_pretrained(resolve_model_path("tiny:z_image"))
    pipe.set_progress_bar_config(disable=True)

    def brightness() -> float:  # the recipe's validation: 12 steps, no CFG (the pipeline's scale is ours - 1)
        images = pipe(prompt=["a cat", "a fox"], height=32, width=32, num_inference_steps=12, guidance_scale=0.0,
                      max_sequence_length=64, generator=torch.Generator().manual_seed(0), output_type="pt").images
        return float(images.mean())

    before = brightness()
    pipe.load_lora_weights(str(out / "lora"))
    assert brightness() > before

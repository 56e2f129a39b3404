"""The tiny HunyuanVideo-1.5 recipe trains end to end and its reward rises.

The whole learning run (the HunyuanVideo family's one in the default run) is judged like the demo: the mean video brightness of the
last 20% of steps beats the first 20% by more than 3 standard errors, with the rollout's and
the trainer's log-probs the same function (`train` checks the gap and the first mini-batch's
ratio); the LoRA it trained loads into diffusers' HunyuanVideo15Pipeline through the
transformer's own loader (the pipeline has no `load_lora_weights`) and brightens the pipeline's
videos as it brightened the adapter's.
"""
import pytest
import torch

from omni_rl.logging import rise_report
from tests.recipes.recipe_runs import train

RECIPE = "tiny_hunyuan_video15_flowgrpo"


def played_streams(path) -> list[str]:
    import av

    with av.open(str(path)) as container:
        return sorted(s.type for s in container.streams)


def pipeline_brightness(lora_folder=None) -> float:
    """Mean brightness of the diffusers pipeline's videos (noise 0, 8 steps, CFG 6) for two
    prompts of the recipe, with the trained LoRA loaded or not."""
    from diffusers import HunyuanVideo15Pipeline

    from omni_rl.models.loading import resolve_model_path

    from adapters.hunyuan_video15 import HunyuanVideo15Adapter

    pipe = HunyuanVideo15Pipeline.from_pretrained(resolve_model_path("tiny:hunyuan_video15"))
    pipe.set_progress_bar_config(disable=True)
    pipe.prompt_template_encode_start_idx = HunyuanVideo15Adapter.prompt_prefix_length(pipe)
    pipe.tokenizer_max_length = 64
    pipe.vae.enable_slicing()
    if lora_folder is not None:
        pipe.transformer.load_lora_adapter(str(lora_folder), weight_name="pytorch_lora_weights.safetensors",
                                           prefix="transformer")
    video = pipe(prompt=["a cat running", "a whale"], height=32, width=32, num_frames=5, num_inference_steps=8,
                 generator=torch.Generator().manual_seed(0), output_type="np").frames
    return float(video.mean())


@pytest.mark.slow
def test_tiny_hunyuan_video15_flowgrpo_learns(tmp_path):
    out = tmp_path / "hunyuan"
    steps = train(out, RECIPE)
    assert len(steps) == 20
    assert all(r["loss/log_prob_mean"] != 0 for r in steps)
    report = rise_report(out / "metrics.jsonl")
    assert report["rose"], report
    assert played_streams(out / "samples" / "val_step_000020" / "00.mp4") == ["video"]
    base, trained = pipeline_brightness(), pipeline_brightness(out / "lora")
    assert trained > base + 0.05, (base, trained)

"""One recipe run as a user runs it, for the recipe tests: `python main_omni.py recipe=NAME` in a
subprocess; the run must exit 0 with the rollout's and the trainer's log-probs the same function
(first-mini-batch ratio within 1e-6 of 1, gap <= 1e-5 on every step; `run_recipe` without those
checks, for losses that have no log-probs), and `brightness_before_and_after_lora`, a trained
LoRA loaded as a diffusers user loads it."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def train(out: Path, recipe: str, *overrides: str) -> list[dict]:
    """The run's training-step records from metrics.jsonl."""
    steps = run_recipe(out, recipe, *overrides)
    assert max(r["actor/first_minibatch_ratio_max_abs_dev"] for r in steps) <= 1e-6
    assert max(r["rollout_corr/logprob_abs_diff_max"] for r in steps) <= 1e-5
    return steps


def run_recipe(out: Path, recipe: str, *overrides: str) -> list[dict]:
    """The run's training-step records, without the log-prob checks (for the forward-process
    losses, which have no log-probs)."""
    proc = subprocess.run(
        [sys.executable, "main_omni.py", f"recipe={recipe}", f"trainer.output_dir={out}", "trainer.logger_options.progress_bar=false",
         *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "actor/first_minibatch_ratio_max_abs_dev" in r]


def brightness_before_and_after_lora(pipeline_class, tiny: str, lora_folder: Path, **call) -> tuple[float, float]:
    """Mean brightness of the diffusers pipeline's images (two of the tiny prompts, seed 0, `call`
    the recipe's validation settings) on `tiny:<tiny>`, then again after the pipeline's own
    `load_lora_weights(lora_folder)`."""
    import torch

    from omni_rl.models.loading import resolve_model_path

    pipe = pipeline_class.from_pretrained(resolve_model_path(f"tiny:{tiny}"))
    pipe.set_progress_bar_config(disable=True)

    def brightness() -> float:
        images = pipe(prompt=["a cat", "a fox"], generator=torch.Generator().manual_seed(0), output_type="pt",
                      **call).images
        return float(images.mean())

    before = brightness()
    pipe.load_lora_weights(str(lora_folder))
    return before, brightness()

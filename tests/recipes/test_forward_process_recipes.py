"""The two forward-process recipes run as a user runs them, 2 steps each: exit 0, finite losses,
the exported LoRA moved (its B matrices start at 0). Their learning is not tested here (CI time)."""
import math

import pytest
from safetensors.torch import load_file

from tests.recipes.recipe_runs import run_recipe


@pytest.mark.parametrize("recipe, keys", [
    ("tiny_sd3_diffusion_nft", ["loss/policy", "loss/nft_positive", "loss/nft_negative", "loss/nft_r_mean"]),
    ("tiny_sd3_diffusion_dpo", ["loss/policy", "loss/dpo_accuracy", "loss/dpo_margin", "actor/dpo_pairs"]),
])
def test_two_steps_finish_with_finite_losses_and_a_moved_lora(tmp_path, recipe, keys):
    out = tmp_path / recipe
    steps = run_recipe(out, recipe, "trainer.total_steps=2", "trainer.val_every=0", "trainer.save_every=0")
    assert [r["step"] for r in steps] == [1, 2]
    for rec in steps:
        for key in keys:
            assert math.isfinite(rec[key]), (key, rec[key])
    lora = load_file(out / "lora" / "pytorch_lora_weights.safetensors")
    moved = [k for k, t in lora.items() if "lora_B" in k and float(t.abs().max()) > 0]
    assert moved, "no LoRA B matrix moved from 0"

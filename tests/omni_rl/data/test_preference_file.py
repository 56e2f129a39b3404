"""Tests for omni_rl.data.preference_file (rows checked, bad ones named by file, row and field)
and the offline pairs it feeds: images through the tiny SD3's VAE into a PairBatch that the
Diffusion-DPO objective trains (log 2 at the reference, a finite gradient)."""
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.compose import load_config
from omni_rl.data.preference_file import PreferenceFileError, load_preference_file, read_pair_images
from omni_rl.families import build_family
from omni_rl.families.preference_pairs import PairBatch
from omni_rl.models.factory import build_model


def image(path, value):
    Image.fromarray(np.full((20, 24, 3), value, dtype=np.uint8)).save(path)
    return path.name


def write_rows(tmp_path, rows):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_rows_load_with_paths_relative_to_the_file(tmp_path):
    w, l = image(tmp_path / "w.png", 200), image(tmp_path / "l.png", 20)
    rows = load_preference_file(write_rows(tmp_path, [{"prompt": "a cat", "chosen": w, "rejected": l}, ""]))
    assert len(rows) == 1 and rows[0].prompt == "a cat" and rows[0].chosen == tmp_path / "w.png"
    chosen, rejected = read_pair_images(rows[0], 32, 16)
    assert chosen.shape == (32, 16, 3) and chosen.dtype == torch.uint8
    assert int(chosen[0, 0, 0]) == 200 and int(rejected[0, 0, 0]) == 20


@pytest.mark.parametrize("row, message", [
    ('{"prompt": "a"', "row 2: not JSON"),
    ('["a", "b"]', "row 2: a list"),
    ({"prompt": "a", "chosen": "w.png"}, "row 2: field 'rejected' is None"),
    ({"prompt": 3, "chosen": "w.png", "rejected": "w.png"}, "row 2: field 'prompt' is 3"),
    ({"prompt": "a", "chosen": "w.png", "rejected": "gone.png"}, "row 2: field 'rejected': .*gone.png is not a file"),
])
def test_bad_rows_name_the_file_row_and_field(tmp_path, row, message):
    w, l = image(tmp_path / "w.png", 1), image(tmp_path / "l.png", 2)
    path = write_rows(tmp_path, [{"prompt": "ok", "chosen": w, "rejected": l}, row])
    with pytest.raises(PreferenceFileError, match=f"pairs.jsonl, {message}"):
        load_preference_file(path)


def test_an_unreadable_image_is_named_when_loaded(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"not a png")
    w = image(tmp_path / "w.png", 1)
    with pytest.raises(PreferenceFileError, match="row 1: field 'rejected': .*broken.png is not a readable image"):
        load_preference_file(write_rows(tmp_path, [{"prompt": "a", "chosen": w, "rejected": "broken.png"}]))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(PreferenceFileError, match="no such preference file"):
        load_preference_file(tmp_path / "none.jsonl")
    with pytest.raises(PreferenceFileError, match="no rows"):
        load_preference_file(write_rows(tmp_path, [""]))


def test_offline_pairs_train_through_the_dpo_objective(tmp_path):
    torch.manual_seed(0)
    cfg = load_config(["recipe=tiny_sd3_diffusion_dpo", "algo.policy_loss_options.diffusion_dpo.beta=10"])
    model = build_model(cfg.model, torch.device("cpu"))
    family = build_family(cfg, model)
    w, l = image(tmp_path / "w.png", 230), image(tmp_path / "l.png", 30)
    rows = load_preference_file(write_rows(tmp_path, [{"prompt": "a cat", "chosen": w, "rejected": l}] * 2))
    images = [read_pair_images(r, cfg.rollout.sampling_options.height, cfg.rollout.sampling_options.width) for r in rows]
    pairs = PairBatch.from_images(model, [r.prompt for r in rows], torch.stack([c for c, _ in images]),
                                  torch.stack([r for _, r in images]), torch.tensor([1, 2]), cfg.rollout.sampling_options.guidance_scale)
    assert tuple(pairs.chosen.shape) == (2, *model.latent_shape(cfg.rollout.sampling_options.height, cfg.rollout.sampling_options.width))
    assert not torch.equal(pairs.chosen, pairs.rejected)
    loss, metrics = family.loss(pairs, 0)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)  # LoRA B = 0: the policy is the reference
    loss.backward()
    grads = [p.grad for p in model.trainable_parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(float(g.abs().max()) > 0 for g in grads)
    assert metrics["loss/dpo_pairs"].item() == 2

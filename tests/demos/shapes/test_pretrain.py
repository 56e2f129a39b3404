"""The shape model's pretraining (demos/shapes/pretrain.py) is deterministic and loads as SD3.

Its first steps, run twice from nothing, give the same losses to the bit (the data is drawn by
index, everything is seeded, one torch thread); the losses fall over those steps; the folder it
writes loads through diffusers' own `StableDiffusion3Pipeline.from_pretrained`, and its checksums
cover every file."""
import hashlib
import json

import torch

from demos.shapes.pretrain import PretrainConfig, pretrain


def test_pretraining_is_deterministic_and_writes_a_loadable_pipeline(tmp_path):
    cfg = PretrainConfig(vae_steps=3, steps=3, vae_batch=4, batch=4)
    threads = torch.get_num_threads()
    try:
        first = pretrain(tmp_path / "a", cfg)
        second = pretrain(tmp_path / "b", cfg)
    finally:
        torch.set_num_threads(threads)
    assert first["vae_loss"] == second["vae_loss"] and first["loss"] == second["loss"]
    assert first["vae_loss"][-1] < first["vae_loss"][0]
    assert json.loads((tmp_path / "a" / "train_log.json").read_text())["loss"] == first["loss"]

    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(tmp_path / "a", text_encoder_3=None, tokenizer_3=None)  # no T5
    assert pipe.vae.config.scaling_factor == first["latent_scale"]
    # a plain SD3 transformer: exactly diffusers' parameter names (no LoRA wrappers), all of them saved
    from safetensors import safe_open

    with safe_open(str(tmp_path / "a" / "transformer" / "diffusion_pytorch_model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(pipe.transformer.state_dict())
    sums = dict(reversed(line.split("  ")) for line in (tmp_path / "a" / "SHA256SUMS").read_text().splitlines())
    files = {p.relative_to(tmp_path / "a").as_posix() for p in (tmp_path / "a").rglob("*") if p.is_file()}
    assert set(sums) == files - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256((tmp_path / "a" / name).read_bytes()).hexdigest() == digest


def test_reuse_vae_takes_an_earlier_stage_one_and_refuses_other_settings(tmp_path):
    import pytest

    cfg = PretrainConfig(vae_steps=2, steps=2, vae_batch=4, batch=4)
    threads = torch.get_num_threads()
    try:
        first = pretrain(tmp_path / "a", cfg)
        again = pretrain(tmp_path / "b", PretrainConfig(vae_steps=2, steps=3, vae_batch=4, batch=4), reuse_vae=tmp_path / "a")
        with pytest.raises(SystemExit, match="vae_steps"):
            pretrain(tmp_path / "c", PretrainConfig(vae_steps=3, steps=2, vae_batch=4, batch=4), reuse_vae=tmp_path / "a")
        record = json.loads((tmp_path / "a" / "train_log.json").read_text())
        (tmp_path / "a" / "train_log.json").write_text(json.dumps({**record, "layout": "free"}))
        with pytest.raises(SystemExit, match="layout 'free'"):  # a VAE of other scenes
            pretrain(tmp_path / "d", cfg, reuse_vae=tmp_path / "a")
    finally:
        torch.set_num_threads(threads)
    assert again["vae_loss"] == first["vae_loss"] and again["vae_reused"] and len(again["loss"]) == 3
    assert again["loss"][:2] == first["loss"]  # the same start, so stage 2's first steps agree too
    vae = "vae/diffusion_pytorch_model.safetensors"
    assert (tmp_path / "a" / vae).read_bytes() == (tmp_path / "b" / vae).read_bytes()

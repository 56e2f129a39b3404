"""demos/talker_before_after.py: the docs' before/after picture from a talker run's validation
folders (step 0 and the last), and its one-line refusal of a run with fewer than two."""
import json

import pytest
import torch
from PIL import Image

from demos.talker_before_after import load_samples, main
from omni_rl.utils.audio import wav_bytes


def write_validation(run, step: int, amplitude: float) -> None:
    folder = run / "samples" / f"val_step_{step:06d}"
    folder.mkdir(parents=True)
    rows = []
    for i in range(2):
        clip = amplitude * torch.sin(torch.arange(128) * (0.3 + i))
        (folder / f"{i:03d}.wav").write_bytes(wav_bytes(clip, 24000))
        rows.append({"wav": f"{i:03d}.wav", "prompt": "p", "spoken_text": f"answer {i}", "frames": 16,
                     "reward": float(clip.pow(2).mean().sqrt())})
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_draws_each_sample_before_and_after(tmp_path):
    write_validation(tmp_path, 0, 0.2)
    write_validation(tmp_path, 10, 0.9)
    out = tmp_path / "before_after.png"
    assert main(["--run", str(tmp_path), "--out", str(out)]) == 0
    with Image.open(out) as image:
        assert image.height > 100 and image.width > image.height  # 2 rows of (before, after)
    rows = load_samples(tmp_path / "samples" / "val_step_000010")
    assert rows[0]["rate"] == 24000 and abs(float(abs(rows[0]["audio"]).max()) - 0.9) < 0.01


def test_a_run_with_one_validation_is_refused(tmp_path):
    write_validation(tmp_path, 0, 0.2)
    with pytest.raises(SystemExit, match="has 1 validation folder"):
        main(["--run", str(tmp_path), "--out", str(tmp_path / "x.png")])

"""rewards/hps.py on a tiny open_clip model: its config JSON and an HPS-style checkpoint
written to disk and loaded back through the reward's own loading code."""
import sys

import numpy as np
import pytest
import torch

from omni_rl.reward import build_reward

PROMPTS = ["a red cube", "a blue ball", "x", "a very long prompt " * 30]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("open_clip", reason="open_clip_torch is not installed (the clip extra)")
    from rewards.tiny_models import build_tiny_open_clip

    config, checkpoint = build_tiny_open_clip(tmp_path_factory.mktemp("tiny_open_clip"))
    return {"architecture": str(config), "checkpoint": str(checkpoint)}


def _images(n=4):
    return torch.from_numpy(np.random.default_rng(0).integers(0, 256, (n, 40, 48, 3), dtype=np.uint8))


def test_score_is_the_cosine_of_open_clip_features_and_batching_does_not_matter(tiny):
    import open_clip
    from PIL import Image

    scorer = build_reward("hpsv2", **tiny)
    images = _images()
    scores = scorer(images, PROMPTS, [{}] * 4)
    assert len(scores) == 4 and all(isinstance(s, float) and -1 <= s <= 1 for s in scores)
    # Reference: open_clip's own model + preprocessing with the checkpoint's weights.
    model, _, preprocess = open_clip.create_model_and_transforms("tiny-hps-test", pretrained=None)
    model.load_state_dict(torch.load(tiny["checkpoint"])["state_dict"])
    model.eval()
    with torch.no_grad():
        pixels = torch.stack([preprocess(Image.fromarray(a)) for a in images.numpy()])
        image = model.encode_image(pixels, normalize=True)
        text = model.encode_text(open_clip.get_tokenizer("tiny-hps-test")(PROMPTS), normalize=True)
    assert scores == pytest.approx(torch.diagonal(image @ text.T).tolist(), abs=1e-5)
    single = [scorer(images[i:i + 1], PROMPTS[i:i + 1], [{}])[0] for i in range(4)]
    assert single == pytest.approx(scores, abs=1e-5)


def test_plain_state_dict_loads_and_a_renamed_key_fails(tiny, tmp_path):
    state = torch.load(tiny["checkpoint"])["state_dict"]
    torch.save(state, tmp_path / "plain.pt")
    build_reward("hpsv2", architecture=tiny["architecture"], checkpoint=str(tmp_path / "plain.pt"))
    state["renamed_logit_scale"] = state.pop("logit_scale")
    torch.save({"state_dict": state}, tmp_path / "renamed.pt")
    pattern = r"1 missing key\(s\) \['logit_scale'\], 1 unexpected key\(s\) \['renamed_logit_scale'\]"
    with pytest.raises(ValueError, match=pattern):
        build_reward("hpsv2", architecture=tiny["architecture"], checkpoint=str(tmp_path / "renamed.pt"))


def test_option_errors(tiny, tmp_path):
    with pytest.raises(ValueError, match="architecture='ViT-Q-99' is not an open_clip model"):
        build_reward("hpsv2", architecture="ViT-Q-99", checkpoint=tiny["checkpoint"])
    with pytest.raises(FileNotFoundError, match="no such file"):
        build_reward("hpsv2", architecture=tiny["architecture"], checkpoint=str(tmp_path / "none.pt"))


def test_missing_open_clip_names_the_package(monkeypatch):  # runs whether or not open_clip is installed
    monkeypatch.setitem(sys.modules, "open_clip", None)  # makes `import open_clip` raise ImportError
    with pytest.raises(ImportError, match="pip install open_clip_torch"):
        build_reward("hpsv2", checkpoint="unused.pt")

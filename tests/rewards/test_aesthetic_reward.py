"""rewards/aesthetic.py: a random head saved to a file and a tiny CLIP, loaded back by path."""
import numpy as np
import pytest
import torch

from omni_rl.reward import RewardConfigError, build_reward
from rewards.aesthetic import AestheticHead
from rewards.tiny_models import build_tiny_clip, write_aesthetic_head


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_clip")
    build_tiny_clip(folder, projection_dim=16)
    return str(folder)


def _images(n=4):
    return torch.from_numpy(np.random.default_rng(0).integers(0, 256, (n, 36, 32, 3), dtype=np.uint8))


def test_head_keys_match_the_released_predictor():
    assert sorted(AestheticHead(768).state_dict()) == sorted(
        f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias")
    )


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_score_is_the_head_on_normalised_clip_features(tmp_path, clip_dir, suffix):
    from PIL import Image
    from safetensors.torch import load_file
    from transformers import CLIPModel, CLIPProcessor

    head_path = tmp_path / f"head{suffix}"
    write_aesthetic_head(head_path, 16)
    scorer = build_reward("aesthetic", head=str(head_path), model=clip_dir)
    images = _images()
    scores = scorer(images, ["ignored"] * 4, [{}] * 4)
    assert len(scores) == 4 and all(isinstance(s, float) for s in scores)
    # Reference written out by hand: CLIP image embeds, L2-normalised, then the five linears.
    model = CLIPModel.from_pretrained(clip_dir).eval()
    pixels = CLIPProcessor.from_pretrained(clip_dir)(images=[Image.fromarray(a) for a in images.numpy()],
                                                     return_tensors="pt")["pixel_values"]
    head = AestheticHead(16)
    head.load_state_dict(torch.load(head_path) if suffix == ".pth" else load_file(str(head_path)))
    with torch.no_grad():
        x = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)
        x = x / x.norm(dim=-1, keepdim=True)
        for i in (0, 2, 4, 6, 7):
            x = head.layers[i](x)
    assert scores == pytest.approx(x.squeeze(-1).tolist(), abs=1e-5)
    single = [scorer(images[i:i + 1], ["p"], [{}])[0] for i in range(4)]
    assert single == pytest.approx(scores, abs=1e-5)


def test_head_errors(tmp_path, clip_dir):
    with pytest.raises(ValueError, match="no head given"):
        build_reward("aesthetic", model=clip_dir)
    # A missing head is found when the options' files are checked (a run's start, before any
    # model loads), as the reference voice of speaker_similarity is.
    with pytest.raises(RewardConfigError, match="reward 'aesthetic': aesthetic: head=.*missing.pth': no such file"):
        build_reward("aesthetic", head=str(tmp_path / "missing.pth"), model=clip_dir)
    state = AestheticHead(16).state_dict()
    state["layers.9.weight"] = state.pop("layers.7.weight")
    torch.save(state, tmp_path / "renamed.pth")
    with pytest.raises(ValueError, match=r"missing keys \['layers.7.weight'\].*unexpected keys \['layers.9.weight'\]"):
        build_reward("aesthetic", head=str(tmp_path / "renamed.pth"), model=clip_dir)
    write_aesthetic_head(tmp_path / "wide.pth", 768)
    with pytest.raises(ValueError, match="takes 768-d features but model=.* gives 16-d"):
        build_reward("aesthetic", head=str(tmp_path / "wide.pth"), model=clip_dir)

"""rewards/clip_score.py on a tiny random CLIP saved with save_pretrained and loaded back by path."""
import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.reward import build_reward
from rewards.tiny_models import build_tiny_clip

PROMPTS = ["a red cube", "a blue ball", "x", "two cats"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_clip")
    build_tiny_clip(folder)
    return str(folder)


def test_cosine_matches_the_models_own_embeddings(clip_dir):
    from transformers import CLIPModel, CLIPProcessor

    images = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8))
    scorer = build_reward("clip_score", model=clip_dir)  # processor defaults to the model folder
    scores = scorer(images, PROMPTS, [{}] * 4)
    model = CLIPModel.from_pretrained(clip_dir).eval()
    processor = CLIPProcessor.from_pretrained(clip_dir)
    inputs = processor(text=PROMPTS, images=[Image.fromarray(a) for a in images.numpy()],
                       padding="max_length", max_length=77, return_tensors="pt")
    with torch.no_grad():
        out = model(**inputs)
    expected = (out.image_embeds * out.text_embeds).sum(-1)  # both unit-norm
    assert scores == pytest.approx(expected.tolist(), abs=1e-5)
    assert all(-1.0 <= s <= 1.0 for s in scores)
    scaled = build_reward("clip_score", model=clip_dir, scale=100.0)(images, PROMPTS, [{}] * 4)
    assert scaled == pytest.approx([100 * s for s in scores], abs=1e-3)
    single = [scorer(images[i:i + 1], PROMPTS[i:i + 1], [{}])[0] for i in range(4)]
    assert single == pytest.approx(scores, abs=1e-5)


def test_prompt_order_matters_per_sample(clip_dir):
    images = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8))
    scorer = build_reward("clip_score", model=clip_dir)
    a = scorer(images, ["one", "two"], [{}, {}])
    b = scorer(images, ["two", "one"], [{}, {}])
    assert a != pytest.approx(b)

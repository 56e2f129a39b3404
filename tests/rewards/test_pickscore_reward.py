"""rewards/pickscore.py on a tiny random CLIP saved with save_pretrained and loaded back by path."""
import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.reward import build_reward
from rewards.tiny_models import build_tiny_clip

PROMPTS = ["a red cube", 'a sign that says "hi"', "x", "a very long prompt " * 30]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_clip")
    build_tiny_clip(folder)
    return str(folder)


def _images(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, (n, 40, 48, 3), dtype=np.uint8))


def test_pickscore_is_logit_scale_times_cosine_over_26(clip_dir):
    from transformers import CLIPModel, CLIPProcessor

    images = _images()
    scores = build_reward("pickscore", model=clip_dir, processor=clip_dir)(images, PROMPTS, [{}] * 4)
    assert len(scores) == 4 and all(isinstance(s, float) for s in scores)
    # Reference: the model's own forward, whose logits_per_image = exp(logit_scale) * cos.
    model = CLIPModel.from_pretrained(clip_dir).eval()
    processor = CLIPProcessor.from_pretrained(clip_dir)
    inputs = processor(text=PROMPTS, images=[Image.fromarray(a) for a in images.numpy()],
                       padding="max_length", truncation=True, max_length=77, return_tensors="pt")
    with torch.no_grad():
        expected = model(**inputs).logits_per_image.diagonal() / 26
    assert scores == pytest.approx(expected.tolist(), abs=1e-5)
    raw = build_reward("pickscore", model=clip_dir, processor=clip_dir, scale=1.0)(images, PROMPTS, [{}] * 4)
    assert raw == pytest.approx([26 * s for s in scores], abs=1e-4)


def test_batched_equals_one_at_a_time_and_pil_equals_tensor(clip_dir):
    scorer = build_reward("pickscore", model=clip_dir, processor=clip_dir)
    images = _images(seed=1)
    batched = scorer(images, PROMPTS, [{}] * 4)
    single = [scorer(images[i:i + 1], PROMPTS[i:i + 1], [{}])[0] for i in range(4)]
    assert batched == pytest.approx(single, abs=1e-5)
    assert scorer([Image.fromarray(a) for a in images.numpy()], PROMPTS, [{}] * 4) == pytest.approx(batched, abs=1e-6)


def test_tiny_model_name_builds_once_and_loads():
    scorer = build_reward("pickscore", model="tiny:clip-reward", processor="tiny:clip-reward")
    assert len(scorer(_images(2), PROMPTS[:2], [{}] * 2)) == 2


def test_missing_weights_say_how_to_fetch(tmp_path):
    with pytest.raises(OSError, match="hf download"):
        build_reward("pickscore", model=str(tmp_path / "nothing_here"), processor=str(tmp_path / "nothing_here"))


@pytest.mark.parametrize("scale", [0.0, float("inf"), "1"])
def test_bad_scale(scale, clip_dir):
    with pytest.raises(ValueError, match="pickscore: scale="):
        build_reward("pickscore", model=clip_dir, processor=clip_dir, scale=scale)

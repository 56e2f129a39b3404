"""rewards/clip_directional.py on a tiny random CLIP saved with save_pretrained and loaded back by path."""
import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.reward import RewardConfigError, RewardInputError, build_reward, reward_modalities
from omni_rl.reward.registry import check_reward_options
from rewards.tiny_models import build_tiny_clip

PROMPTS = ["make it brighter", "make it darker", "add a hat"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_clip")
    build_tiny_clip(folder)
    return str(folder)


def _pil(n, seed):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]


def _reference(clip_dir, edits, sources, targets, origins):
    """The formula written out on the model's own unit-norm embeddings."""
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(clip_dir).eval()
    processor = CLIPProcessor.from_pretrained(clip_dir)

    def image(images):
        with torch.no_grad():
            out = model.get_image_features(**processor(images=images, return_tensors="pt"))
        out = out if isinstance(out, torch.Tensor) else out.pooler_output
        return out / out.norm(dim=-1, keepdim=True)

    def text(texts):
        tokens = processor(text=texts, padding="max_length", max_length=77, return_tensors="pt")
        with torch.no_grad():
            out = model.get_text_features(**tokens)
        out = out if isinstance(out, torch.Tensor) else out.pooler_output
        return out / out.norm(dim=-1, keepdim=True)

    d_img, d_txt = image(edits) - image(sources), text(targets) - text(origins)
    return ((d_img * d_txt).sum(-1) / (d_img.norm(dim=-1) * d_txt.norm(dim=-1))).tolist()


def test_score_is_the_cosine_of_the_image_change_and_the_caption_change(clip_dir):
    edits, sources = _pil(3, 0), _pil(3, 1)
    metadata = [
        {"source_image": s, "target_text": f"a bright picture {k}", "source_text": f"a dull picture {k}"}
        for k, s in enumerate(sources)
    ]
    score = build_reward("clip_directional", model=clip_dir)
    scores = score(edits, PROMPTS, metadata)
    expected = _reference(clip_dir, edits, sources, [m["target_text"] for m in metadata], [m["source_text"] for m in metadata])
    assert scores == pytest.approx(expected, abs=1e-5)
    assert all(-1 <= s <= 1 for s in scores)
    # tensor edits score like PIL ones; batch_size=1 forwards and the whole batch agree; scale multiplies
    tensor = torch.from_numpy(np.stack([np.asarray(e) for e in edits]))
    one_at_a_time = build_reward("clip_directional", model=clip_dir, batch_size=1, scale=100.0)
    assert one_at_a_time(tensor, PROMPTS, metadata) == pytest.approx([100 * s for s in scores], abs=1e-3)


def test_missing_captions_fall_back_to_the_instruction_and_the_empty_text(clip_dir):
    edits, sources = _pil(3, 2), _pil(3, 3)
    score = build_reward("clip_directional", model=clip_dir)
    bare = [{"source_image": s} for s in sources]
    explicit = [{"source_image": s, "target_text": p, "source_text": ""} for s, p in zip(sources, PROMPTS)]
    assert score(edits, PROMPTS, bare) == pytest.approx(score(edits, PROMPTS, explicit), abs=1e-6)
    assert score(edits, PROMPTS, bare) == pytest.approx(_reference(clip_dir, edits, sources, PROMPTS, [""] * 3), abs=1e-5)
    strict = build_reward("clip_directional", model=clip_dir, require_captions=True)
    assert strict(edits, PROMPTS, [dict(m, source_text="a picture") for m in explicit]) == pytest.approx(
        score(edits, PROMPTS, [dict(m, source_text="a picture") for m in explicit]), abs=1e-6)
    with pytest.raises(RewardInputError, match=r"metadata\[0\] has no 'source_text' and require_captions=True"):
        strict(edits, PROMPTS, [{"source_image": sources[0], "target_text": "x"}] + explicit[1:])
    with pytest.raises(RewardInputError, match=r"metadata\[0\] has no 'target_text' and require_captions=True"):
        strict(edits, PROMPTS, bare)


def test_the_source_image_matters_and_an_unchanged_edit_scores_0(clip_dir):
    edits, sources = _pil(3, 4), _pil(3, 5)
    score = build_reward("clip_directional", model=clip_dir)
    metadata = [{"source_image": s, "target_text": "a red cube", "source_text": "a blue ball"} for s in sources]
    rolled = [dict(m, source_image=sources[(k + 1) % 3]) for k, m in enumerate(metadata)]
    a, b = score(edits, PROMPTS, metadata), score(edits, PROMPTS, rolled)
    assert all(x != pytest.approx(y, abs=1e-4) for x, y in zip(a, b))
    assert score(sources, PROMPTS, metadata) == pytest.approx([0.0] * 3, abs=1e-6)


def test_input_errors(clip_dir):
    score = build_reward("clip_directional", model=clip_dir)
    edits = _pil(1, 6)
    with pytest.raises(RewardInputError, match=r"reward 'clip_directional': metadata\[i\]\['source_image'\] is missing .* needs an edit dataset"):
        score(edits, ["make it brighter"], [{}])
    with pytest.raises(RewardInputError, match=r"sample 0 has the same target and source text \('a cat'\), so there is no text direction"):
        score(edits, ["x"], [{"source_image": edits[0], "target_text": "a cat", "source_text": "a cat"}])
    with pytest.raises(RewardInputError, match=r"metadata\[0\]\['target_text'\] has type int; expected str"):
        score(edits, ["x"], [{"source_image": edits[0], "target_text": 3}])


def test_options_are_checked_at_load_and_it_scores_images():
    with pytest.raises(RewardConfigError, match=r"reward 'clip_directional': batch_size=0; expected an int >= 1"):
        check_reward_options("clip_directional", {"batch_size": 0})
    with pytest.raises(RewardConfigError, match=r"require_captions='yes'; expected true or false"):
        check_reward_options("clip_directional", {"require_captions": "yes"})
    with pytest.raises(RewardConfigError, match=r"unknown option\(s\) 'modle'"):
        check_reward_options("clip_directional", {"modle": "x"})
    assert reward_modalities("clip_directional") == {"image"}

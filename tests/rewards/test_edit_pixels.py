"""rewards/edit_pixels.py: edit_brightness and source_consistency, values worked out by hand."""
import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.data.prompts import read_prompt_file
from omni_rl.reward import RewardInputError, build_reward, reward_modalities
from omni_rl.reward.protocol import image_to_wire


def _flat(value, size=(4, 4)):
    """A PIL image of one grey level (luma = value / 255)."""
    return Image.new("RGB", size, (value, value, value))


def _edits(*values, size=4):
    return torch.tensor([[[[v] * 3] * size] * size for v in values], dtype=torch.uint8)


def test_edit_brightness_by_hand_from_metadata_and_from_the_instruction():
    score = build_reward("edit_brightness")
    edits = _edits(200, 200, 50, 50)
    sources = [_flat(100), _flat(100), _flat(150), _flat(150)]
    prompts = ["whatever", "make it brighter", "Make it DARKER.", "lighten it up"]
    metadata = [{"source_image": sources[0], "brightness_direction": -1}] + [{"source_image": s} for s in sources[1:]]
    # (200 - 100) / 255 = 0.392 wanted darker -> -0.392; brighter -> +0.392;
    # (50 - 150) / 255 = -0.392 wanted darker -> +0.392; "lighten" wants brighter -> -0.392
    assert score(edits, prompts, metadata) == pytest.approx([-100 / 255, 100 / 255, 100 / 255, -100 / 255])
    # luma is the brightness reward's BT.601: pure red is 0.299, pure green 0.587
    red = Image.new("RGB", (3, 2), (255, 0, 0))
    green = torch.tensor([[[[0, 255, 0]] * 3] * 2], dtype=torch.uint8)
    assert score(green, ["brighter"], [{"source_image": red}]) == pytest.approx([0.587 - 0.299])


def test_edit_brightness_direction_errors_name_the_prompt():
    score = build_reward("edit_brightness")
    meta = [{"source_image": _flat(0)}]
    with pytest.raises(RewardInputError, match=r"prompt 0 \('make it blue'\) says neither 'brighter'/'lighter' nor 'darker'.*brightness_direction"):
        score(_edits(9), ["make it blue"], meta)
    with pytest.raises(RewardInputError, match=r"says both"):
        score(_edits(9), ["lighter or darker"], meta)
    with pytest.raises(RewardInputError, match=r"metadata\[0\]\['brightness_direction'\] is 2; expected \+1 \(brighter\) or -1"):
        score(_edits(9), ["brighter"], [{"source_image": _flat(0), "brightness_direction": 2}])
    # "brightness" is not "brighter": whole words only
    with pytest.raises(RewardInputError, match=r"neither"):
        score(_edits(9), ["fix the brightness"], meta)


def test_source_consistency_by_hand_with_a_resized_source():
    score = build_reward("source_consistency")
    edits = _edits(100, 100, 0)
    # same image -> 1; |100 - 151| = 51 -> 1 - 51/255 = 0.8; a 2x3 white source resized to 4x4 -> 0
    metadata = [{"source_image": _flat(100)}, {"source_image": _flat(151)}, {"source_image": _flat(255, (2, 3))}]
    assert score(edits, ["a"] * 3, metadata) == pytest.approx([1.0, 0.8, 0.0])
    # the difference is per channel: a red edit of a black source differs in one channel of three
    red = torch.tensor([[[[255, 0, 0]] * 2] * 2], dtype=torch.uint8)
    assert score(red, ["a"], [{"source_image": _flat(0, (2, 2))}]) == pytest.approx([2 / 3])


def test_both_depend_on_the_source_image_shuffling_sources_changes_scores():
    items = read_prompt_file("recipes/prompts/tiny_edit.jsonl")
    rng = np.random.default_rng(0)
    edits = torch.from_numpy(rng.integers(0, 256, (len(items), 32, 32, 3), dtype=np.uint8))
    prompts = [i.prompt for i in items]
    metadata = [dict(i.metadata) for i in items]
    shuffled = [dict(m, source_image=metadata[(k + 3) % len(metadata)]["source_image"]) for k, m in enumerate(metadata)]
    for name in ("edit_brightness", "source_consistency"):
        score = build_reward(name)
        a, b = score(edits, prompts, metadata), score(edits, prompts, shuffled)
        assert all(x != pytest.approx(y) for x, y in zip(a, b)), name


def test_an_unchanged_image_is_0_brighter_and_fully_consistent():
    items = read_prompt_file("recipes/prompts/tiny_edit.jsonl")
    edits = [i.metadata["source_image"] for i in items]  # PIL images are scored like the tensor form
    prompts, metadata = [i.prompt for i in items], [i.metadata for i in items]
    assert build_reward("edit_brightness")(edits, prompts, metadata) == pytest.approx([0.0] * 8)
    assert build_reward("source_consistency")(edits, prompts, metadata) == pytest.approx([1.0] * 8)


def test_without_source_images_they_ask_for_an_edit_dataset():
    for name in ("edit_brightness", "source_consistency"):
        with pytest.raises(RewardInputError, match=rf"reward '{name}': metadata\[i\]\['source_image'\] is missing for sample\(s\) 1 of 2 .*needs an edit dataset: a prompt file whose rows carry 'source_image'"):
            build_reward(name)(_edits(1, 2), ["brighter"] * 2, [{"source_image": _flat(0)}, {"brightness_direction": 1}])
    with pytest.raises(RewardInputError, match=r"metadata\[0\]\['source_image'\] has type str; expected a PIL image"):
        build_reward("source_consistency")(_edits(1), ["a"], [{"source_image": "img/a.png"}])
    with pytest.raises(RewardInputError, match=r"mode 'RGBA', with an alpha channel"):
        build_reward("source_consistency")(_edits(1), ["a"], [{"source_image": Image.new("RGBA", (2, 2))}])


def test_sources_as_protocol_data_uris_score_as_pil_ones_and_modalities():
    source = _flat(100)
    edits = _edits(200)
    for name in ("edit_brightness", "source_consistency"):
        score = build_reward(name)
        assert score(edits, ["brighter"], [{"source_image": image_to_wire(source)}]) == score(edits, ["brighter"], [{"source_image": source}])
        assert reward_modalities(name) == {"image"}

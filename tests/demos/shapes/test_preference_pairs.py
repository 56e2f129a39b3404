"""demos/shapes/preference_pairs.py: right shape scenes over near misses, a preference file that
omni_rl.data.preference_file loads."""
import torch

from omni_rl.data.preference_file import load_preference_file, read_pair_images


def test_shape_pairs_are_right_over_a_near_miss_for_every_task(tmp_path):
    """The detector scores every chosen image 1 and every rejected one 0 (one thing the caption
    checks made wrong), the file loads, and the same seed writes the same pairs."""
    from demos.shapes import TASKS, sample_pair
    from demos.shapes.preference_pairs import write_pairs
    from omni_rl.reward import build_reward

    captions = [sample_pair(seed, task).caption for task in TASKS for seed in range(3)]
    path = write_pairs(captions, per_caption=2, size=64, seed=0, out=tmp_path / "a")
    rows = load_preference_file(path)
    assert [r.prompt for r in rows] == [c for c in captions for _ in range(2)]
    chosen, rejected = zip(*(read_pair_images(r, 64, 64) for r in rows))
    detector = build_reward("geneval_shapes")
    prompts = [r.prompt for r in rows]
    assert list(detector(torch.stack(chosen), prompts, [{} for _ in rows]).scores) == [1.0] * len(rows)
    assert list(detector(torch.stack(rejected), prompts, [{} for _ in rows]).scores) == [0.0] * len(rows)
    again = write_pairs(captions, per_caption=2, size=64, seed=0, out=tmp_path / "b")
    assert again.read_text() == path.read_text()
    for name in sorted((tmp_path / "a" / "images").iterdir()):
        assert name.read_bytes() == (tmp_path / "b" / "images" / name.name).read_bytes()

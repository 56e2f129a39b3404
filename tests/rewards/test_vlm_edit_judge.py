"""rewards/vlm_edit_judge.py against the reference reward server, for real on 127.0.0.1: the judge
served there looks at both images, so the scores show the source image reaches it."""
import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.data.prompts import read_prompt_file
from omni_rl.reward import RewardConfigError, RewardInputError, RewardManager, RewardSpec, build_reward, reward_modalities
from omni_rl.reward.http_client import RewardServerError
from omni_rl.reward.protocol import image_from_wire
from omni_rl.reward.registry import check_reward_options
from omni_rl.reward.server import load_scorer, running_server
from rewards.vlm_edit_judge import edit_cases

FAST = {"backoff_s": 0.01, "retries": 1}


def _luma(image):
    return float((np.asarray(image, dtype=np.float64) @ [0.299, 0.587, 0.114]).mean() / 255)


def rule_judge(images, prompts, metadata):
    """A stand-in VLM: +1 per unit of luma moved the way the instruction says, from source to edit."""
    scores = []
    for case in edit_cases(images, prompts, metadata):
        sign = 1 if "brighter" in case.instruction or "lighter" in case.instruction else -1
        scores.append(sign * (_luma(case.edited) - _luma(case.source)))
    return scores


def _batch(seed=0):
    items = read_prompt_file("recipes/prompts/tiny_edit.jsonl")
    edits = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (len(items), 32, 32, 3), dtype=np.uint8))
    # without brightness_direction: the judge reads the direction from the instruction (the prompt)
    metadata = [{k: v for k, v in i.metadata.items() if k != "brightness_direction"} for i in items]
    return edits, [i.prompt for i in items], metadata


def test_the_judge_sees_instruction_edit_and_source():
    edits, prompts, metadata = _batch()
    local = build_reward("edit_brightness")(edits, prompts, metadata)
    with running_server(rule_judge) as (_, url):
        judge = build_reward("vlm_edit_judge", url=url, batch_size=3, **FAST)
        remote = judge(edits, prompts, metadata)
        # the same edits judged against other sources get other scores: the source is looked at
        shuffled = [dict(m, source_image=metadata[(k + 3) % 8]["source_image"]) for k, m in enumerate(metadata)]
        remote_shuffled = judge(edits, prompts, shuffled)
    assert remote == pytest.approx(local, abs=1e-9)
    assert all(a != pytest.approx(b) for a, b in zip(remote, remote_shuffled))


def test_a_registered_edit_reward_serves_as_the_judge_and_the_manager_runs_it():
    edits, prompts, metadata = _batch(1)
    metadata = [dict(m, latent=torch.zeros(4)) for m in metadata]  # what the trainer adds; not sent
    local = build_reward("edit_brightness")(edits, prompts, metadata)
    with running_server(load_scorer("reward:edit_brightness")) as (_, url):
        manager = RewardManager([RewardSpec("vlm_edit_judge", kwargs={"url": url, **FAST})])
        out = manager.score(edits, prompts, metadata)
    assert out.total.tolist() == pytest.approx(local, abs=1e-6)  # the manager sums in float32


def test_what_the_judge_receives_in_requests_of_batch_size():
    seen = []

    def recorder(tensor, prompts, metadata):
        seen.append((tensor.clone(), list(prompts), metadata))
        return [float(i) for i in range(len(prompts))]

    source = Image.fromarray(np.random.default_rng(2).integers(0, 256, (5, 7, 3), dtype=np.uint8))
    reference = Image.new("RGB", (2, 2), (1, 2, 3))
    edits = torch.randint(0, 256, (5, 4, 4, 3), dtype=torch.uint8)
    prompts = [f"make it brighter {k}" for k in range(5)]
    metadata = [{"source_image": source, "target_text": "a bright one", "latent": torch.zeros(2)} for _ in range(5)]
    metadata[4] = {"source_image": source, "reference_image": reference, "id": 4}
    with running_server(recorder) as (_, url):
        scores = build_reward("vlm_edit_judge", url=url, batch_size=2)(edits, prompts, metadata)
    assert scores == [0.0, 1.0, 0.0, 1.0, 0.0]  # three requests: 2 + 2 + 1, in order
    assert [len(p) for _, p, _ in seen] == [2, 2, 1]
    assert torch.equal(torch.cat([t for t, _, _ in seen]), edits)
    assert sum((p for _, p, _ in seen), []) == prompts
    sent = sum((m for _, _, m in seen), [])
    assert sorted(sent[0]) == ["source_image", "target_text"] and sent[0]["target_text"] == "a bright one"
    assert sorted(sent[4]) == ["id", "reference_image", "source_image"]
    assert all(np.array_equal(np.asarray(image_from_wire(m["source_image"])), np.asarray(source)) for m in sent)
    assert image_from_wire(sent[4]["reference_image"]).getpixel((0, 0)) == (1, 2, 3)


def test_without_source_images_nothing_is_sent_and_a_judge_answers_400():
    calls = []
    edits = torch.zeros(2, 4, 4, 3, dtype=torch.uint8)
    with running_server(lambda *args: calls.append(1) or [0.0, 0.0]) as (_, url):
        judge = build_reward("vlm_edit_judge", url=url)
        with pytest.raises(RewardInputError, match=r"reward 'vlm_edit_judge': metadata\[i\]\['source_image'\] is missing for sample\(s\) 0, 1 of 2 .*needs an edit dataset"):
            judge(edits, ["make it brighter"] * 2, [{}, {}])
        with pytest.raises(RewardInputError, match=r"images has shape \(2, 3, 4, 4, 3\); expected 4 dims"):
            judge(torch.zeros(2, 3, 4, 4, 3, dtype=torch.uint8), ["a", "b"], [{}, {}])
    assert calls == []
    # a client that sends no sources (the plain http_scorer) gets the judge's 400, not a score
    with running_server(rule_judge) as (_, url):
        with pytest.raises(RewardServerError, match=r"HTTP 400: the scorer refused the batch: reward 'vlm_edit_judge': metadata\[i\]\['source_image'\] is missing"):
            build_reward("http_scorer", url=url, **FAST)(edits, ["a", "b"], [{}, {}])


def test_options_are_checked_at_load():
    with pytest.raises(RewardConfigError, match=r"reward 'vlm_edit_judge': url='ftp://x' has the scheme 'ftp'"):
        check_reward_options("vlm_edit_judge", {"url": "ftp://x"})
    with pytest.raises(RewardConfigError, match=r"batch_size=0; expected an int >= 1 \(samples per request\)"):
        check_reward_options("vlm_edit_judge", {"url": "http://127.0.0.1:1", "batch_size": 0})
    with pytest.raises(RewardConfigError, match=r"missing a required argument: 'url'"):
        check_reward_options("vlm_edit_judge", {})
    assert reward_modalities("vlm_edit_judge") == {"image"}

"""`--plan`'s reward models (`omni_rl.plan.rewards`): each reward's networks built on the meta
device from config files, counted as the loaded reward holds them, placed where the run scores,
and added to the training device's peaks."""
import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.plan.planner import make_plan
from omni_rl.plan.rewards import plan_rewards
from omni_rl.plugins import load_plugins
from omni_rl.reward.registry import build_reward, reward_declaration
from tests.omni_rl.plan.test_planner import real_recipes

# Published size of open_clip's ViT-H-14 (HPS v2.1's architecture): 986.11M parameters, the
# `mparams` column of docs/model_profile.csv in the open_clip repository (mlfoundations/open_clip).
VIT_H_14_PARAMS = 986.11e6

load_plugins()  # the rewards' registry entries, read here before any reward is built


def held_bytes(*modules) -> int:
    tensors = {id(t): t for m in modules for t in (*m.parameters(), *m.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


@pytest.mark.parametrize(("reward", "network_attr"), [
    ("clip_score", lambda s: s.clip.model),
    ("pickscore", lambda s: s.clip.model),
    ("clap", lambda s: s.model),
    ("asr_wer", lambda s: s.model),
])
def test_a_weightless_reward_network_holds_what_the_loaded_reward_holds(reward, network_attr, tmp_path):
    tiny = {"clip_score": "tiny:clip-reward", "pickscore": "tiny:clip-reward", "clap": "tiny:clap-reward",
            "asr_wer": "tiny:whisper-reward"}[reward]
    options = {"model": tiny, "processor": tiny, "device": "cpu"}
    (source, weightless), = reward_declaration(reward).device_networks(**options)
    assert source == tiny
    assert all(p.device.type == "meta" for p in weightless.parameters())
    loaded = network_attr(build_reward(reward, **options))
    assert held_bytes(weightless) == held_bytes(loaded) > 0
    assert {p.dtype for p in weightless.parameters()} == {p.dtype for p in loaded.parameters()}


def test_speaker_similarity_and_the_aesthetic_head_count_what_they_load():
    (_, wavlm), = reward_declaration("speaker_similarity").device_networks(
        model="tiny:wavlm-sv-reward", reference_audio="unused.wav")
    from transformers import WavLMForXVector

    from rewards.pretrained import load_pretrained

    real = load_pretrained(WavLMForXVector, "tiny:wavlm-sv-reward", "model", "speaker_similarity")
    assert held_bytes(wavlm) == held_bytes(real) > 0
    networks = reward_declaration("aesthetic").device_networks(model="tiny:clip-reward")
    assert [label for label, _ in networks] == ["tiny:clip-reward", "aesthetic head"]
    head = networks[1][1]
    assert sum(p.numel() for p in head.parameters()) == 768 * 1024 + 1024 + 1024 * 128 + 128 + 128 * 64 + 64 + 64 * 16 + 16 + 16 + 1


def test_hpsv2s_vit_h_14_is_counted_at_its_published_size():
    (label, model), = reward_declaration("hpsv2").device_networks()
    params = sum(p.numel() for p in model.parameters())
    assert label == "open_clip ViT-H-14"
    assert abs(params - VIT_H_14_PARAMS) / VIT_H_14_PARAMS < 0.02, params
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_reward_models_go_where_the_run_scores_and_into_the_peaks():
    base = ["recipe=tiny_sd3_flowgrpo", "reward.rewards=[{name: hpsv2}]"]
    on_device = plan_rewards(load_config(base))
    (row,) = on_device["models"]
    assert row["where"] == "a training device" and row["on_training_device"]
    assert on_device["device_bytes"] == row["bytes"] > 3.6 * 2**30  # 986M fp32 parameters

    host = plan_rewards(load_config(["recipe=tiny_sd3_flowgrpo", "reward.rewards=[{name: hpsv2, reward_options: {device: cpu}}]"]))
    assert host["models"][0]["where"] == "host" and host["device_bytes"] == 0

    rules = plan_rewards(load_config(["recipe=tiny_sd3_flowgrpo"]))
    assert rules["device_bytes"] == 0
    assert all(m["network"] is None and m["bytes"] == 0 for m in rules["models"])

    with_model = make_plan(load_config(base))
    without = make_plan(load_config(["recipe=tiny_sd3_flowgrpo"]))
    for peak in ("training", "rollout"):
        assert with_model["peaks"][peak] - without["peaks"][peak] == row["bytes"]


def test_reward_workers_hold_the_training_rewards_and_the_trainer_the_validation_ones():
    cfg = load_config(["recipe=tiny_sd3_flowgrpo", "reward.rewards=[{name: hpsv2}]",
                       "reward.val_rewards=[{name: clip_score, reward_options: {model: tiny:clip-reward, processor: tiny:clip-reward}}]",
                       "reward.worker_options.num_workers=1"])
    plan = plan_rewards(cfg)
    train, val = plan["models"]
    assert (train["use"], train["where"]) == ("train", "reward workers")
    assert (val["use"], val["where"]) == ("validation", "a training device")
    assert plan["device_bytes"] == val["bytes"] > 0


def test_a_hub_id_without_a_shipped_config_is_one_line_naming_the_option():
    cfg = load_config(["recipe=tiny_sd3_flowgrpo", "reward.rewards=[{name: clip_score, reward_options: {model: someone/no-such-clip}}]"])
    with pytest.raises(ConfigError) as err:
        plan_rewards(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert "model='someone/no-such-clip'" in message and "config.json" in message


@pytest.mark.parametrize("recipe", real_recipes())
def test_every_real_recipes_reward_networks_build_at_real_size_from_shipped_configs(recipe, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config([f"recipe={recipe}"])
    plan = plan_rewards(cfg)
    declared = {item.name for item in cfg.reward.rewards if reward_declaration(item.name).device_networks is not None}
    held = [m for m in plan["models"] if m["network"] is not None]
    assert {m["reward"] for m in held} == declared
    for m in held:
        assert m["parameters"] > 5e7, m  # the smallest, WavLM base-plus's x-vector model, is 100M
    assert plan["device_bytes"] == sum(m["bytes"] for m in held if m["on_training_device"])

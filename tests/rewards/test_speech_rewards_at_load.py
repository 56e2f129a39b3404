"""The speech rewards' load-time errors, each one `error:` line before any model loads:

- a speech reward on a model that makes no audio (the modality check of omni_rl/compose.py);
- a reward that compares with the text a sample was asked to say (asr_wer, speech_rate) when
  neither the model adds it to its samples' metadata (`sample_metadata_keys`) nor every prompt
  carries it (omni_rl/reward/prompt_checks.py check_reward_prompts);
- a reference voice file that is missing or not audio (speaker_similarity's check_files, run when a run starts).
"""
import json
import math
import wave

import pytest
import torch

from omni_rl.cli import main
from omni_rl.reward.prompt_checks import check_reward_prompts
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.data.prompts import PromptFileError, check_prompt_sources
from omni_rl.config.options import NoOptions
from omni_rl.models.registry import register_adapter

LTX2 = "recipe=tiny_ltx2_flowgrpo_av"  # a model that makes audio (and adds no spoken_text)


@register_adapter("TestsSpeakingPipeline")
class SpeakingAdapter:
    """Stands in for a talker stage: it makes audio and puts each sample's text in its metadata."""

    family = "diffusion"
    makes_audio = True
    sample_metadata_keys = frozenset({"spoken_text"})
    options_class = NoOptions


@pytest.fixture(scope="module")
def voice(tmp_path_factory):
    path = tmp_path_factory.mktemp("voice") / "voice.wav"
    t = torch.arange(16000) / 16000
    pcm = (0.5 * torch.cos(2 * math.pi * 250 * t) * 32767).round().to(torch.int16)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(pcm.numpy().astype("<i2").tobytes())
    return str(path)


def speech_rewards(voice: str) -> list[str]:
    return [
        "{name: asr_wer, reward_options: {model: never/loaded}}",
        "{name: speech_rate}",
        f"{{name: speaker_similarity, reward_options: {{reference_audio: '{voice}', model: never/loaded}}}}",
    ]


def one_error_line(capsys, *args: str) -> str:
    assert main(list(args)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and "Traceback" not in captured.err
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


@pytest.mark.parametrize("index", [0, 1, 2])
@pytest.mark.parametrize("model", [
    ["recipe=tiny_sd3_flowgrpo"],                   # images
    ["recipe=tiny_qwen3_omni_gspo"],                # text (Qwen3-Omni's thinker)
    ["model.adapter=WanPipeline", "model.path=tiny:wan22", "rollout.sampling_options.num_frames=9"],  # video
])
def test_a_speech_reward_on_a_model_that_makes_no_audio(voice, index, model):
    name = ["asr_wer", "speech_rate", "speaker_similarity"][index]
    with pytest.raises(ConfigError) as info:
        load_config([*model, f"reward.rewards=[{speech_rewards(voice)[index]}]"])
    message = str(info.value)
    assert message.startswith(f"reward.rewards[0]: reward {name!r} scores audio, but model.adapter=")
    assert "makes no audio; drop the reward or use an audio model's adapter" in message and "\n" not in message


def test_on_the_command_line_it_is_one_error_line(capsys, voice, tmp_path):
    line = one_error_line(capsys, "recipe=tiny_qwen3_omni_gspo", f"reward.rewards=[{speech_rewards(voice)[0]}]",
                          f"trainer.output_dir={tmp_path}")
    assert "reward 'asr_wer' scores audio" in line and "makes no audio" in line


@pytest.mark.parametrize("reward, key", [
    ("{name: asr_wer, reward_options: {model: tiny:whisper-reward}}", "spoken_text"),
    ("{name: speech_rate, reward_options: {text_key: answer}}", "answer"),
])
def test_a_text_reward_with_no_text_to_compare_against(capsys, tmp_path, reward, key):
    line = one_error_line(capsys, LTX2, f"reward.rewards=[{reward}]", f"trainer.output_dir={tmp_path}")
    assert line.startswith("error: data.prompts: reward.rewards[0]: reward ")
    assert f"needs metadata[{key!r}] on every sample, but model.adapter='LTX2Pipeline'" in line
    assert "does not add it (it adds: nothing) and prompt 0 ('rain on a tin roof') does not carry it" in line
    assert f"give every prompt a metadata.{key}" in line


def test_validation_rewards_are_checked_against_validation_prompts(capsys, tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text(json.dumps({"prompt": "say hi", "metadata": {"spoken_text": "hi"}}) + "\n")
    line = one_error_line(capsys, LTX2, f"data.prompt_file={rows}", "data.prompts=null", "reward.rewards=[{name: speech_rate}]",
                          "data.val_prompts=[a choir]", "reward.val_rewards=[{name: audio_loudness}, {name: speech_rate}]",
                          f"trainer.output_dir={tmp_path / 'out'}")
    assert line.startswith("error: data.val_prompts: reward.val_rewards[1]: reward 'speech_rate' needs metadata['spoken_text']")
    assert "prompt 0 ('a choir')" in line


def sources_of(cfg):
    return check_prompt_sources(cfg.data)


def test_the_text_may_come_from_the_prompts_or_from_the_model(tmp_path):
    rows = tmp_path / "speak.jsonl"
    rows.write_text("".join(json.dumps({"prompt": p, "metadata": {"spoken_text": p}}) + "\n" for p in ("hi", "bye")))
    reward = "reward.rewards=[{name: asr_wer, reward_options: {model: never/loaded}}, {name: speech_rate}]"
    cfg = load_config([LTX2, f"data.prompt_file={rows}", "data.prompts=null", reward])
    check_reward_prompts(cfg, sources_of(cfg))  # every row carries spoken_text
    # One row without it is named.
    rows.write_text(rows.read_text() + json.dumps({"prompt": "mute", "metadata": {"other": 1}}) + "\n")
    with pytest.raises(PromptFileError, match=r"reward.rewards\[0\]: reward 'asr_wer' .*prompt 2 \('mute'\)"):
        check_reward_prompts(cfg, sources_of(cfg))
    # A model that adds spoken_text to its samples (a talker stage) needs nothing from the prompts.
    cfg = load_config([LTX2, reward])
    cfg.model.adapter = "TestsSpeakingPipeline"
    check_reward_prompts(cfg, sources_of(cfg))
    # ...but a reward reading another key still does.
    cfg.reward.rewards[1].reward_options = {"text_key": "answer"}
    with pytest.raises(PromptFileError, match=r"reward.rewards\[1\]: reward 'speech_rate' needs metadata\['answer'\].*"
                                              r"\(it adds: spoken_text\)"):
        check_reward_prompts(cfg, sources_of(cfg))


@pytest.mark.parametrize("make, expected", [
    (lambda d: d / "absent.wav", "absent.wav': no such file; expected a WAV file (integer PCM)"),
    (lambda d: (d / "text.wav").write_text("hello") and d / "text.wav", "text.wav': not a readable WAV file"),
])
def test_a_reference_voice_that_is_missing_or_not_audio(capsys, tmp_path, make, expected):
    path = make(tmp_path)
    reward = f"reward.rewards=[{{name: speaker_similarity, reward_options: {{reference_audio: '{path}'}}}}]"
    line = one_error_line(capsys, LTX2, reward, f"trainer.output_dir={tmp_path / 'out'}")
    assert line.startswith("error: reward.rewards[0].reward_options: reward 'speaker_similarity': reference_audio=")
    assert expected in line


@pytest.mark.parametrize("stage", ["talker", "thinker_talker"])
def test_a_talker_stage_adds_the_text_its_samples_were_asked_to_say(stage):
    """The real talker adapter (not a stand-in) declares `spoken_text`, so the speech rewards that
    compare with it load on text prompts that carry none."""
    reward = "reward.rewards=[{name: asr_wer, reward_options: {model: never/loaded}}, {name: speech_rate}]"
    cfg = load_config(["recipe=tiny_qwen3_omni_talker_grpo", f"model.stage={stage}", reward])
    check_reward_prompts(cfg, sources_of(cfg))


@pytest.mark.parametrize("reward, expected", [
    # Issue 45, L2: an image reward on the talker trained until step 1 said the samples hold only audio.
    ("{name: brightness}", "reward.rewards[0]: reward 'brightness' scores image, text, but model.adapter="
                           "'Qwen3OmniMoeForConditionalGeneration/talker' (family talker) hands its rewards audio only; "
                           "drop the reward or pick one that scores audio"),
    ("{name: char_match}", "reward.rewards[0]: reward 'char_match' scores image, text, but model.adapter="),
    # ...and char_match with an empty set of characters, refused by its constructor after the load.
    ("{name: char_match, reward_options: {chars: '', text_key: spoken_text}}",
     "reward.rewards[0].reward_options: reward 'char_match': chars=''; expected a non-empty string, e.g. 'a' or 'aeiou'"),
])
def test_a_reward_the_talker_cannot_feed_is_one_line_at_load(capsys, tmp_path, reward, expected):
    line = one_error_line(capsys, "recipe=tiny_qwen3_omni_talker_grpo", f"reward.rewards=[{reward}]",
                          f"trainer.output_dir={tmp_path / 'out'}")
    assert line.startswith(f"error: {expected}")
    assert not (tmp_path / "out").exists()


def test_a_text_rule_with_a_text_key_scores_the_talker():
    cfg = load_config(["recipe=tiny_qwen3_omni_talker_grpo",
                       "reward.rewards=[{name: char_match, reward_options: {chars: ab, text_key: spoken_text}}]"])
    check_reward_prompts(cfg, sources_of(cfg))


def test_an_image_reward_on_a_text_model_is_refused():
    with pytest.raises(ConfigError, match=r"reward 'edit_brightness' scores image, but model.adapter='Qwen3ForCausalLM' "
                                          r"\(family autoregressive\) hands its rewards text only"):
        load_config(["recipe=tiny_qwen3_grpo", "reward.rewards=[{name: edit_brightness}]"])

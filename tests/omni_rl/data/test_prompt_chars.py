"""omni_rl/data/prompt_chars.py: a prompt's characters bounded when the prompts load, before any
tokenizer sees them (issue 29 item 11: a 50 MB line aborts the SD3 and Qwen3 tokenizers)."""
import json
import logging

import numpy as np
import pytest
from PIL import Image

from omni_rl.compose import load_config
from omni_rl.data.preference_file import PreferenceFileError, load_preference_file
from omni_rl.data.prompt_chars import CHARS_PER_TOKEN, DEFAULT_MAX_PROMPT_CHARS, bound_prompt_chars
from omni_rl.data.prompt_item import PromptItem
from omni_rl.data.prompt_length import PromptLengthError
from omni_rl.data.prompts import check_prompt_sources, training_prompt_items
from omni_rl.families.base import prompt_limits

HUGE = DEFAULT_MAX_PROMPT_CHARS + 1


def _cfg(tmp_path, lines, *overrides, recipe="tiny_sd3_flowgrpo"):
    path = tmp_path / "p.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_config([f"recipe={recipe}", "data.prompts=null", f"data.prompt_file={path}", *overrides])


def test_a_huge_prompt_line_is_refused_in_one_line_before_tokenizing(tmp_path):
    cfg = _cfg(tmp_path, ["a cat", "x" * HUGE])
    with pytest.raises(PromptLengthError, match=rf"p.txt'?: prompt 1 \('xxx.*'\) is {HUGE:,} characters, over the bound "
                                                 rf"of {DEFAULT_MAX_PROMPT_CHARS:,} .*checked before tokenizing") as err:
        check_prompt_sources(cfg.data)
    assert "\n" not in str(err.value)


def test_the_bound_derives_from_max_prompt_tokens(tmp_path):
    limit = 4
    cfg = _cfg(tmp_path, ["y" * (limit * CHARS_PER_TOKEN), "z" * (limit * CHARS_PER_TOKEN + 1)],
               f"algo.family_options.max_prompt_tokens={limit}", recipe="tiny_qwen3_grpo")
    with pytest.raises(PromptLengthError, match=rf"prompt 1 .* over the bound of {limit * CHARS_PER_TOKEN:,} "
                                                 rf"\(algo.family_options.max_prompt_tokens={limit} x {CHARS_PER_TOKEN}"):
        training_prompt_items(cfg.data, prompt_limits(cfg))


def test_truncate_keeps_the_end_and_drop_leaves_it_out_with_one_warning(tmp_path, caplog):
    lines = ["a cat", "x" * HUGE + " What is it?"]
    with caplog.at_level(logging.WARNING, logger="omni_rl.data.prompt_chars"):
        # The mode is a text model's option (algo.family_options); a diffusion model's is error.
        kept_cfg = _cfg(tmp_path, lines, "algo.family_options.overlong_prompts=truncate", recipe="tiny_qwen3_grpo")
        dropped_cfg = _cfg(tmp_path, lines, "algo.family_options.overlong_prompts=drop", recipe="tiny_qwen3_grpo")
        kept = training_prompt_items(kept_cfg.data, prompt_limits(kept_cfg))
        dropped = training_prompt_items(dropped_cfg.data, prompt_limits(dropped_cfg))
    assert kept[0].prompt == "a cat" and len(kept[1].prompt) == DEFAULT_MAX_PROMPT_CHARS
    assert kept[1].prompt.endswith("x What is it?")
    assert [item.prompt for item in dropped] == ["a cat"]
    said = [r.getMessage() for r in caplog.records if "checked before tokenizing" in r.getMessage()]
    assert len(said) == 2 and "1 prompts truncated" in said[0] and "1 dropped" in said[1]


def test_a_chat_truncates_its_last_user_message_and_counts_the_others():
    system = {"role": "system", "content": "s" * 10}
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "u" * 2000}]}
    item = PromptItem("u" * 2000, messages=(system, user))
    (cut,) = bound_prompt_chars([item], 1, "truncate", "data.prompts")  # a bound of 256 characters
    assert cut.messages[0] == system and cut.messages[1]["content"][0] == {"type": "image"}
    assert len(cut.messages[1]["content"][1]["text"]) == CHARS_PER_TOKEN - 10
    big_system = PromptItem("u", messages=({"role": "system", "content": "s" * 300}, {"role": "user", "content": "u"}))
    with pytest.raises(PromptLengthError, match="prompt 0 .* is 301 characters"):
        bound_prompt_chars([big_system], 1, "truncate", "data.prompts")


def test_an_edit_instruction_is_bounded_like_a_prompt(tmp_path):
    Image.new("RGB", (4, 4)).save(tmp_path / "s.png")
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps({"instruction": "b" * HUGE, "source_image": "s.png"}) + "\n")
    cfg = load_config(["recipe=tiny_qwen_image_edit_flowgrpo", f"data.prompt_file={path}"])
    with pytest.raises(PromptLengthError, match=f"prompt 0 .* is {HUGE:,} characters"):
        check_prompt_sources(cfg.data)


def test_a_preference_prompt_over_the_bound_is_refused(tmp_path):
    for name, value in (("w.png", 1), ("l.png", 2)):
        Image.fromarray(np.full((4, 4, 3), value, dtype=np.uint8)).save(tmp_path / name)
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "p" * 300, "chosen": "w.png", "rejected": "l.png"}) + "\n")
    assert len(load_preference_file(path, max_prompt_tokens=2)) == 1
    with pytest.raises(PreferenceFileError, match="row 1: field 'prompt' is 300 characters, over the bound of 256"):
        load_preference_file(path, max_prompt_tokens=1)

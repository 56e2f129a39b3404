"""`fit_prompt_lengths` and truncation, with a counter worked out by hand: one token per
character of the rendered chat, plus 5 template tokens per message and 3 for the generation
prompt (so a plain prompt of k characters counts k + 8)."""
import pytest

from omni_rl.data.prompt_item import PromptFileError, PromptItem
from omni_rl.data.prompt_length import (
    PromptLengthError,
    fit_prompt_lengths,
    keep_last_chars,
    last_user_text,
    truncate_to_limit,
)


def count(item: PromptItem) -> int:
    messages = item.messages or ({"role": "user", "content": item.prompt},)
    total = 3
    for m in messages:
        content = m["content"]
        text = content if isinstance(content, str) else "\n".join(p["text"] for p in content if p["type"] == "text")
        images = 0 if isinstance(content, str) else sum(p["type"] == "image" for p in content)
        total += 5 + len(text) + 4 * images
    return total


def fit(items, limit, mode):
    return fit_prompt_lengths(items, count, limit, mode, "data.prompts", "the model's 64 positions less 16")


def test_short_prompts_pass_unchanged():
    items = [PromptItem("abc"), PromptItem("d" * 40)]  # 11 and 48 tokens
    report = fit(items, 48, "error")
    assert report.items == items and report.items[1] is items[1]
    assert report.truncated == [] and report.dropped == []


def test_error_names_the_prompt_its_count_and_the_limit():
    items = [PromptItem("short"), PromptItem("Once upon a time " * 10)]  # 170 chars -> 178 tokens
    with pytest.raises(PromptLengthError) as err:
        fit(items, 48, "error")
    message = str(err.value)
    assert "data.prompts: prompt 1 ('Once upon a time Once upon a time Once u...')" in message
    assert "178 tokens" in message and "48-token limit (the model's 64 positions less 16)" in message
    assert "algo.family_options.overlong_prompts=truncate" in message and "algo.family_options.overlong_prompts=drop" in message
    assert isinstance(err.value, PromptFileError)  # the CLI's exit 2, one line


def test_truncate_keeps_the_end_of_the_prompt_within_the_limit():
    items = [PromptItem("x" * 100 + " What is 2+2?", {"ground_truth": "4"})]  # 121 tokens
    report = fit(items, 48, "truncate")
    (cut,) = report.items
    assert count(cut) == 48  # as much as fits: 40 characters + 8
    assert cut.prompt == ("x" * 100 + " What is 2+2?")[-40:] and cut.prompt.endswith("What is 2+2?")
    assert cut.metadata == {"ground_truth": "4"}
    assert report.truncated == [(0, 121, 48)]


def test_truncate_cuts_only_the_last_user_message_of_a_chat():
    system = {"role": "system", "content": "be brief"}  # 5 + 8
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a" * 30},
                                        {"type": "text", "text": "b" * 10}]}
    item = PromptItem("a" * 30 + "\n" + "b" * 10, messages=(system, user), media={"images": ["img"]})
    # 3 + 13 + (5 + 41 + 4) = 66 tokens; the limit 40 leaves 40 - 25 = 15 characters of text.
    cut = truncate_to_limit(item, count, 40)
    assert count(cut) == 40
    assert cut.messages[0] == system and cut.media == item.media
    parts = cut.messages[1]["content"]
    assert parts[0] == {"type": "image"}  # media placeholders are never cut
    assert last_user_text(cut) == cut.prompt == "aaaa\n" + "b" * 10
    assert item.messages[1]["content"][1]["text"] == "a" * 30  # the original is untouched


def test_a_prompt_whose_template_alone_is_over_cannot_be_truncated():
    system = {"role": "system", "content": "s" * 60}
    item = PromptItem("question", messages=(system, {"role": "user", "content": "question"}))
    assert truncate_to_limit(item, count, 48) is None
    with pytest.raises(PromptLengthError, match="cannot be cut to fit"):
        fit([item], 48, "truncate")


def test_drop_leaves_the_long_ones_out_and_says_which():
    items = [PromptItem("a"), PromptItem("b" * 100), PromptItem("c")]
    report = fit(items, 48, "drop")
    assert report.items == [items[0], items[2]]
    assert report.dropped == [(1, 108)]
    with pytest.raises(PromptLengthError, match="left none"):
        fit([items[1]], 48, "drop")


def test_keep_last_chars_of_a_plain_prompt():
    item = PromptItem("hello world")
    assert keep_last_chars(item, 5).prompt == "world"
    assert keep_last_chars(item, 0).prompt == ""


@pytest.mark.parametrize("override, expected", [
    ("algo.family_options.overlong_prompts=cut", "algo.family_options.overlong_prompts='cut': expected one of error, truncate, drop"),
    ("algo.family_options.max_prompt_tokens=0", "algo.family_options.max_prompt_tokens=0: expected an integer >= 1, or null"),
])
def test_bad_values_fail_at_load(override, expected):
    from omni_rl.compose import load_config
    from omni_rl.errors import ConfigError

    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_config(["recipe=tiny_qwen3_grpo", override])

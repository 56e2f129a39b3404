"""`tiny:qwen3` builds a random-weight two-layer Qwen3 (hidden 32) with a byte-level tokenizer
(every byte is a token, plus the chat special tokens) and a ChatML template; `tiny:qwen3_hd32`
the same at hidden 64 with 32-wide heads, the smallest head vLLM's CPU attention runs.
The builders of the adapter in `adapters/qwen3.py`; other tiny models reuse the tokenizer."""
from __future__ import annotations

from pathlib import Path

import torch

from omni_rl.models import register_tiny_model
from omni_rl.models.tiny_vocab import bpe_files, byte_chars

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_level_vocab() -> dict[str, int]:
    """A byte-level BPE vocabulary (no merges): token i is byte i."""
    chars = byte_chars()
    return {chars[b]: b for b in range(256)}


def with_spaced_words(vocab: dict[str, int], words) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) adding each of `words` after a space (GPT-2's "Ġword") as one token, built by
    merges that each extend a word's prefix, so those words tokenise whole and other text byte by byte."""
    space = byte_chars()[ord(" ")]
    vocab, merges = dict(vocab), []
    for word in sorted(set(words)):
        piece = space
        for char in word:
            if (piece, char) not in merges:
                merges.append((piece, char))
            piece += char
            vocab.setdefault(piece, len(vocab))
    return vocab, merges


def build_byte_tokenizer(words=()):
    """The byte-level tokenizer; `words` (after a space) become whole tokens (`with_spaced_words`)."""
    from transformers import Qwen2Tokenizer

    with bpe_files(*with_spaced_words(byte_level_vocab(), words)) as (vocab, merges):
        tokenizer = Qwen2Tokenizer(
            str(vocab), str(merges), unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"
        )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def write_tiny_qwen3(folder: Path, hidden_size: int, num_attention_heads: int, num_key_value_heads: int,
                     head_dim: int, words=()) -> None:
    """A random-weight two-layer Qwen3 of the given attention shape (seed 0), tied embeddings,
    with the byte-level tokenizer (`words` as whole tokens) and ChatML template."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = Path(folder)
    torch.manual_seed(0)
    tokenizer = build_byte_tokenizer(words)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads, head_dim=head_dim,
        max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, architectures=["Qwen3ForCausalLM"],
    )
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@register_tiny_model("qwen3")
def build_tiny_qwen3(folder: Path) -> None:
    write_tiny_qwen3(folder, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8)


# vLLM's CPU attention takes head_dim >= 32 and refuses tiny:qwen3's 8 at start-up: the same
# model with two 32-wide heads (one key/value head), for rollout.backend=vllm on a CPU.
@register_tiny_model("qwen3_hd32")
def build_tiny_qwen3_hd32(folder: Path) -> None:
    write_tiny_qwen3(folder, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32)


# The parts of Qwen3's tool-calling chat format the tiny templates share: the system turn that
# lists the tools (it opens `{% if tools %}` and leaves it open for the template's own ending), and
# an assistant turn's calls with the turn's end.
TOOLS_SYSTEM_TURN = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
)
TOOL_CALLS_AND_END = (
    "{% if m['role'] == 'assistant' and m.get('tool_calls') %}"
    "{% for call in m['tool_calls'] %}{% set call = call['function'] if call.get('function') else call %}"
    "{% if (loop.first and m['content']) or not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ call['name'] }}\", \"arguments\": "
    "{{ call['arguments'] if call['arguments'] is string else call['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n"
)
# Qwen3's chat format for tools, written for the byte-level tiny tokenizer: the tools' JSON
# schemas go in a system turn inside <tools></tools>, an assistant's calls are
# <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, and consecutive tool answers
# share one user turn, each inside <tool_response></tool_response>. The same text layout as the
# template shipped with Qwen3 checkpoints (thinking blocks left out: the tiny model never thinks).
QWEN3_TOOLS_TEMPLATE = (
    TOOLS_SYSTEM_TURN +
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] if m['content'] is string else '' }}" +
    TOOL_CALLS_AND_END +
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen3's vocabulary has these as single tokens; so does the tiny tools tokenizer.
QWEN3_TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


def build_tools_tokenizer():
    """The byte-level tokenizer with Qwen3's tool tokens and tool-calling chat template."""
    tokenizer = build_byte_tokenizer()
    tokenizer.add_tokens(list(QWEN3_TOOL_TOKENS))
    tokenizer.chat_template = QWEN3_TOOLS_TEMPLATE
    return tokenizer


def write_tiny_qwen3_tools(folder: Path, seed: int = 0, hidden_size: int = 32, head_dim: int = 8,
                           rope_theta: float = 10000.0) -> None:
    """`tiny:qwen3` with the tools tokenizer and 1024 positions (a tool list in the system turn
    is some 500 byte tokens); four query and two key/value heads of `head_dim`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = Path(folder)
    torch.manual_seed(seed)
    tokenizer = build_tools_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        architectures=["Qwen3ForCausalLM"],
    )
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@register_tiny_model("qwen3_tools")
def build_tiny_qwen3_tools(folder: Path) -> None:
    write_tiny_qwen3_tools(folder)

"""The calculator task: arithmetic questions a tiny model cannot answer alone, and its rewards.

`arithmetic_answer` scores a trajectory's answer (its last model turn) 1 when its last number
is the question's value, else `call_credit` when the trajectory called the calculator and got an
answer (shaped partial credit, so a policy that does not yet answer right still climbs towards
calling; 0 by default, the plain accuracy). The question is the prompt itself (`7*8`), or
`metadata["expression"]`. `trajectory_return` is an environment's per-turn rewards combined as
`agent.turn_reward` says (`Trajectory.env_return`).

`tiny:qwen3_calculator` is `tiny:qwen3_tools` after a short supervised cold start on the task's
format (`cold_start`): agentic RL on a model that has never produced a tool call has no signal
to climb, so, as in the recipes that train tool-using LLMs, the model first sees a few hundred
demonstrations; 40% of them answer directly (and wrongly: the answers are random), 60% call
the calculator and copy its answer. RL then has to find that calling pays.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, Sequence

import torch

from agent_tools.calculator import evaluate, format_number
from omni_rl.models import register_tiny_model
from omni_rl.reward import register_reward

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_EXPRESSION = re.compile(r"[\d\s+\-*/().%]+")


def question_value(prompt: str, metadata: dict[str, Any]) -> str:
    expression = metadata.get("expression") or prompt.strip().rstrip("=?").strip()
    if not _EXPRESSION.fullmatch(expression):
        raise ValueError(f"arithmetic_answer: prompt {prompt[:40]!r} is not an arithmetic expression; give the "
                         f"question as the prompt (e.g. 7*8) or in metadata['expression']")
    return format_number(evaluate(expression))


def called_calculator(metadata: dict[str, Any]) -> bool:
    trajectory = metadata.get("trajectory") or {}
    return any(c["ok"] and c["name"] == "calculator" for c in trajectory.get("tool_calls", []))


class ArithmeticAnswer:
    def __init__(self, call_credit: float = 0.0):
        if not 0 <= call_credit < 1:
            raise ValueError(f"call_credit={call_credit!r}: expected in [0, 1) (a right answer scores 1)")
        self.call_credit = call_credit

    def __call__(self, samples: Sequence[str], prompts: Sequence[str], metadata: Sequence[dict]) -> list[float]:
        scores = []
        for text, prompt, meta in zip(samples, prompts, metadata):
            numbers = _NUMBER.findall(str(text))
            if numbers and numbers[-1] == question_value(prompt, meta):
                scores.append(1.0)
            else:
                scores.append(self.call_credit if called_calculator(meta) else 0.0)
        return scores


def _check_arithmetic(*, call_credit: float = 0.0) -> None:
    ArithmeticAnswer(call_credit)


@register_reward("arithmetic_answer", modalities=("text",), check_options=_check_arithmetic)
def arithmetic_answer(call_credit: float = 0.0) -> ArithmeticAnswer:
    return ArithmeticAnswer(call_credit)


class TrajectoryReturn:
    def __call__(self, samples, prompts: Sequence[str], metadata: Sequence[dict]) -> list[float]:
        out = []
        for i, meta in enumerate(metadata):
            if "trajectory" not in meta:
                raise ValueError(f"trajectory_return: sample {i} has no metadata['trajectory']; it scores agent "
                                 f"trajectories (a config with an agent: block)")
            out.append(float(meta["trajectory"]["env_return"]))
        return out


@register_reward("trajectory_return", modalities=("text",))
def trajectory_return() -> TrajectoryReturn:
    return TrajectoryReturn()


# --- the cold-started tiny model ---------------------------------------------------------------

QUESTIONS = [f"{a}*{b}" for a in range(2, 10) for b in range(2, 10)]


def demonstration(question: str, calls: bool, rng: random.Random) -> list[dict]:
    """A conversation of the task: a direct (random) answer, or a calculator call and its answer."""
    user = {"role": "user", "content": question}
    if not calls:
        return [user, {"role": "assistant", "content": str(rng.randint(4, 81))}]
    value = format_number(evaluate(question))
    call = {"name": "calculator", "arguments": {"expression": question}}
    return [user, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": value},
            {"role": "assistant", "content": value}]


def demonstration_ids(tokenizer, tools: list[dict], messages: list[dict]) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a conversation: 1 on the assistant turns' tokens after their header."""
    ids, mask = [], []
    header = len(tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False))
    for end in range(1, len(messages) + 1):
        # Each prefix's rendering extends the previous one: the tokens it adds are the turn's.
        text = tokenizer.apply_chat_template(messages[:end], tools=tools, tokenize=False)
        new = tokenizer.encode(text, add_special_tokens=False)[len(ids):]
        trained = messages[end - 1]["role"] == "assistant"
        mask += [0] * header + [1] * (len(new) - header) if trained else [0] * len(new)
        ids += new
    return ids, mask


def cold_start(folder: Path, steps: int = 500, call_share: float = 0.6, seed: int = 0, batch: int = 16,
               log_every: int = 0, head_dim: int = 16) -> None:
    """Teacher-force `tiny:qwen3_tools` on task demonstrations (loss on the assistant turns only)
    and save it to `folder`. The system turn (the tool list, some 500 tokens, the same in every
    demonstration) is encoded once per step without gradient and shared by the batch's rows
    through the KV cache: the update trains the rest, ten times fewer tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adapters.tiny.qwen3 import write_tiny_qwen3_tools
    from agent_tools.calculator import Calculator

    # Twice tiny:qwen3's width, 16-wide heads and a short RoPE wavelength: copying the question
    # into the call reads a token some 50 positions back, which 8-wide heads at theta 10^4 barely
    # tell from its neighbours.
    write_tiny_qwen3_tools(folder, seed=seed, hidden_size=64, head_dim=head_dim, rope_theta=500.0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tools = [Calculator(None).schema()]
    rng = random.Random(seed)
    torch.manual_seed(seed)
    shared, _ = demonstration_ids(tokenizer, tools, [{"role": "user", "content": "2*2"}])
    shared = shared[:shared.index(tokenizer.convert_tokens_to_ids("<|im_start|>"), 1)]  # the system turn
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        rows, masks = [], []
        for _ in range(batch):
            ids, mask = demonstration_ids(tokenizer, tools, demonstration(rng.choice(QUESTIONS),
                                                                          rng.random() < call_share, rng))
            if ids[:len(shared)] != shared:
                raise ValueError("the demonstrations do not start with the same system turn; the cold start shares it")
            rows.append(ids[len(shared):])
            masks.append(mask[len(shared):])
        with torch.no_grad():
            cache = model(input_ids=torch.tensor([shared]), use_cache=True).cache
        cache.batch_repeat_interleave(len(rows))
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        mask = torch.zeros((len(rows), width))
        attention = torch.ones((len(rows), len(shared) + width), dtype=torch.long)
        for i, (r, m) in enumerate(zip(rows, masks)):
            ids[i, :len(r)], mask[i, :len(m)] = torch.tensor(r), torch.tensor(m, dtype=torch.float)
            attention[i, len(shared) + len(r):] = 0
        positions = torch.arange(len(shared), len(shared) + width).expand(len(rows), -1)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, cache=cache,
                       use_cache=True).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (loss * mask[:, 1:]).sum() / mask[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if log_every and (step + 1) % log_every == 0:
            print(f"cold start step {step + 1}: loss {float(loss.detach()):.3f}", flush=True)
    model.eval()
    model.save_pretrained(folder)
    (Path(folder) / "cold_start.json").write_text(json.dumps(
        {"steps": steps, "call_share": call_share, "seed": seed, "batch": batch, "final_loss": float(loss.detach())}))


@register_tiny_model("qwen3_calculator")
def build_tiny_qwen3_calculator(folder: Path) -> None:
    cold_start(folder, log_every=50)


@register_tiny_model("qwen3_calculator_hd32")
def build_tiny_qwen3_calculator_hd32(folder: Path) -> None:
    """tiny:qwen3_calculator with 32-wide heads (vLLM's CPU attention takes none narrower) and a
    shorter cold start (150 steps of 8, 90% of them calling): at temperature 0.3 it writes
    well-formed calculator calls, which the vllm_cpu multi-turn test needs; at 1.0 most are malformed."""
    cold_start(folder, steps=150, batch=8, call_share=0.9, head_dim=32, log_every=50)

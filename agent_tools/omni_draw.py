"""`tiny:qwen3_omni_draw`: the tiny Qwen3-Omni thinker after a short supervised cold start on the
draw tool's format, so that an omni agent run (recipes/tiny_qwen3_omni_draw_agent.yaml) draws and
is fed its images from the first step.

A random tiny model almost never writes a well-formed tool call; agentic RL on it has no signal
(the calculator task's `tiny:qwen3_calculator` is cold-started for the same reason). The
demonstrations: a shape request as the user turn; in `call_share` of them (all, by default) the
assistant calls `draw` with one of a few shape captions (not necessarily the request's: which
caption to draw is what RL may then learn), reads the tool turn (a 32 px image through the image
placeholder, and the tool's text) and answers `done`; in the rest it answers `done` at once. The
loss is on the assistant turns only.

Why every demonstration calls: the 32-wide model tells its first turn from its second (after a
tool answer) only with training; at 70% calls, 150 steps, it answered `done` at once 95% of the
time (the first token's marginal over both turns). After 200 steps at 100% (about 5 minutes on 2
busy cores, once per cache) its first turn calls with probability 0.999 and its second answers;
sampled at temperature 1 a whole 85-token call is still often malformed (1 of 16 drawn in a
measured step), the failure RL then has to train away. Not here: the tool (`draw.py`) and its
reward (`drawn_score`).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from omni_rl.models import register_tiny_model

REQUESTS = ("three red circles", "two blue squares", "four green triangles", "three yellow squares",
            "one red square", "two green circles")
CAPTIONS = ("a red circle", "two blue squares", "four green triangles", "a yellow square")
ANSWER = "done"


def demonstration(request: str, calls: bool, rng: random.Random) -> tuple[list[dict], list]:
    """(messages, images) of one conversation of the task."""
    user = {"role": "user", "content": request}
    if not calls:
        return [user, {"role": "assistant", "content": ANSWER}], []
    call = {"name": "draw", "arguments": {"prompt": rng.choice(CAPTIONS)}}
    image = torch.zeros(32, 32, 3, dtype=torch.uint8)
    image[8:24, 8:24] = torch.tensor([rng.randrange(256) for _ in range(3)], dtype=torch.uint8)
    tool = {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "img-1: drawn"}]}
    return [user, {"role": "assistant", "content": "", "tool_calls": [call]}, tool,
            {"role": "assistant", "content": ANSWER}], [image]


def demonstration_inputs(model, tools: list[dict], messages: list[dict], images: list):
    """(ids [T], loss mask [T], media) of a conversation through the adapter's own template and
    processor: the mask is 1 on each assistant turn's tokens after its header."""
    from omni_rl.agent.chat import as_pil

    text = model.chat_text(messages, tools=tools)
    encoded = model.encode_media_text(text, [as_pil(i) for i in images])
    ids = encoded.input_ids
    mask = torch.zeros(len(ids))
    header = model.encode_text("<|im_start|>assistant\n")
    end = model.eos_token_ids[0]
    row, k = ids.tolist(), 0
    while k < len(row):
        if row[k:k + len(header)] == header:
            start = k + len(header)
            stop = row.index(end, start)
            mask[start:stop + 1] = 1
            k = stop
        k += 1
    return ids, mask, encoded.media


def cold_start(folder: Path, steps: int = 200, call_share: float = 1.0, seed: int = 0, batch: int = 8,
               log_every: int = 0) -> None:
    """Teacher-force `tiny:qwen3_omni`'s weights on the task's demonstrations (every thinker
    weight but the towers trains) and save the whole checkpoint to `folder`."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from adapters.tiny.qwen3_omni import build_tiny_omni
    from agent_tools.draw import Draw
    from omni_rl.compose import load_config
    from omni_rl.models.factory import build_model
    from omni_rl.rollout.text_sampling import join_media

    folder = Path(folder)
    build_tiny_omni(folder)
    cfg = load_config(["recipe=tiny_qwen3_omni_draw_agent", f"model.path={folder}", "model.lora.enabled=false"])
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    tools = [Draw.schema()]
    rng = random.Random(seed)
    torch.manual_seed(seed)
    params = [p for p in model.thinker.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-3)
    # The system turn (the tool list, some 700 tokens, the same in every demonstration) is encoded
    # once per step without gradient and shared by the batch's rows through the KV cache; the
    # update trains the rest (a fifth of the tokens). Its images get their positions from the
    # adapter's cached path, the one the rollout feeds a tool turn through.
    probe = demonstration_inputs(model, tools, *demonstration(REQUESTS[0], False, rng))[0].tolist()
    im_start = model.encode_text("<|im_start|>")[0]
    shared = probe[:probe.index(im_start, 1)]
    for step in range(steps):
        rows = [demonstration_inputs(model, tools, *demonstration(rng.choice(REQUESTS), rng.random() < call_share, rng))
                for _ in range(batch)]
        if any(r[0][:len(shared)].tolist() != shared for r in rows):
            raise ValueError("the demonstrations do not start with the same system turn; the cold start shares it")
        width = max(len(r[0]) - len(shared) for r in rows)
        ids = torch.full((batch, width), model.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, width))
        attention = torch.ones((batch, len(shared) + width), dtype=torch.long)
        for i, (row_ids, row_mask, _) in enumerate(rows):
            n = len(row_ids) - len(shared)
            ids[i, :n], mask[i, :n] = row_ids[len(shared):], row_mask[len(shared):]
            attention[i, len(shared) + n:] = 0
        cache = model.new_cache()
        with torch.no_grad():
            model.forward_logits(torch.tensor([shared]), torch.ones(1, len(shared), dtype=torch.long), cache=cache,
                                 logits_to_keep=1)
        cache.kv.batch_repeat_interleave(batch)
        cache.rope_deltas = cache.rope_deltas.repeat(batch)
        logits, _ = model.forward_logits(ids, attention, join_media([r[2] for r in rows]), cache=cache)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (loss * mask[:, 1:]).sum() / mask[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if log_every and (step + 1) % log_every == 0:
            print(f"cold start step {step + 1}: loss {float(loss.detach()):.3f}", flush=True)
    full = Qwen3OmniMoeForConditionalGeneration.from_pretrained(folder)
    full.thinker.load_state_dict(model.thinker.state_dict())
    full.save_pretrained(folder)
    (folder / "cold_start.json").write_text(json.dumps(
        {"steps": steps, "call_share": call_share, "seed": seed, "batch": batch, "final_loss": float(loss.detach())}))


@register_tiny_model("qwen3_omni_draw")
def build_tiny_qwen3_omni_draw(folder: Path) -> None:
    cold_start(folder, log_every=25)

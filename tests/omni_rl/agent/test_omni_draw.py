"""An omni agent sees the draw tool's image (issue 41, item 2), on the tiny Qwen3-Omni thinker.

The random model never writes a tool call, so the sessions here read every model turn as a call to
a painting tool (a scripted `decode`): the tokens are the model's own, sampled and scored by the
real engine, and what follows each turn is the real tool turn with its image, through the chat
template's image placeholder and the processor."""
from __future__ import annotations

import json
import pickle

import pytest
import torch

from omni_rl.agent import Observation, Tool
from omni_rl.agent.chat import ChatFormat
from omni_rl.agent.loop import run_trajectories
from omni_rl.compose import load_config
from omni_rl.data.prompts import PromptItem
from omni_rl.data.text_batch import TextBatch
from omni_rl.families.agent import write_conversations
from omni_rl.families.base import build_family
from omni_rl.models.factory import build_model
from omni_rl.rollout.backends import build_rollout_engine
from omni_rl.rollout.text_sampling import join_media
from tests.omni_rl.agent.encoded_tokens import counting_encoded_tokens

# The random tiny thinker (the recipe's cold-started one takes minutes to build).
SMALL = ["recipe=tiny_qwen3_omni_draw_agent", "model.path=tiny:qwen3_omni", "rollout.sampling_options.max_new_tokens=4",
         "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.mini_batch_size=4",
         "trainer.micro_batch_size=4"]
CALL = '<tool_call>\n{"name": "draw", "arguments": {"prompt": "a red square"}}\n</tool_call>'


class Paint(Tool):
    """A `draw` stand-in: a 32 px square of one colour on black, no diffusion model."""

    name = "draw"
    parameters = {"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}

    def __init__(self, colour):
        super().__init__(None)
        self.colour = colour

    def __call__(self, arguments):
        image = torch.zeros(32, 32, 3, dtype=torch.uint8)
        image[8:24, 8:24] = torch.tensor(self.colour, dtype=torch.uint8)
        return Observation(text="img-1: drawn", image=image)


ITEMS = [PromptItem("three red circles", {}), PromptItem("two blue squares", {})]


def roll(family, engine, colour):
    requests = [family.request(item, 10 + i) for i, item in enumerate(ITEMS)]
    results, trajectories = run_trajectories(
        engine, requests, [i.prompt for i in ITEMS], [{} for _ in ITEMS], family.agent, {"draw": Paint(colour)},
        family.chat, decode=lambda ids: CALL)
    batch = TextBatch.from_results(results, [i.prompt for i in ITEMS], [{"trajectory": t.to_dict()} for t in trajectories],
                                   [0, 1], family.model.pad_token_id)
    return results, trajectories, batch


@pytest.fixture(scope="module")
def omni():
    cfg = load_config(SMALL)
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    family = build_family(cfg, model)
    engine = build_rollout_engine(cfg, model)
    with counting_encoded_tokens(model) as encoded:
        rolled = roll(family, engine, (255, 0, 0))
    return model, family, engine, rolled, torch.stack(encoded).sum(0)


def test_the_image_is_fed_at_its_placeholders_and_travels_with_the_sample(omni):
    model, family, _, (results, trajectories, batch), _ = omni
    image_token = model.image_token_id
    for i, (r, t) in enumerate(zip(results, trajectories)):
        # max_turns=3: two tool turns, each with one 32 px image = 4 placeholder tokens (2 x 2 merged patches).
        assert t.finish_reason == "max_turns" and len(t.images) == 2
        assert r.response_media["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
        response = batch.sequences[i, batch.prompt_width:]
        placeholders = response == image_token
        assert int(placeholders.sum()) == 8
        assert (batch.response_mask[i][placeholders] == 0).all(), "an image's tokens are fed, never trained on"
        # The sample's media: the prompt's (no image) joined with the trajectory's two images.
        assert torch.equal(batch.media[i]["pixel_values"], r.response_media["pixel_values"])
        tool_turn = t.messages[-2 if t.messages[-1]["role"] == "assistant" else -1]
        assert tool_turn["role"] == "tool" and tool_turn["content"][0] == {"type": "image", "image": "image-1"}


def test_only_the_new_turn_is_encoded(omni):
    _, _, _, (_, _, batch), encoded = omni
    # Every prompt and response token, images' placeholders included, went through one forward at
    # most (KV reuse: a tool turn is fed alone on the cache); only a trajectory's very last
    # sampled token may never be fed (nothing is sampled after it).
    held = batch.attention_mask.sum(1)
    assert ((encoded == held) | (encoded == held - 1)).all(), (encoded.tolist(), held.tolist())


def test_rollout_and_trainer_agree_with_images_in_the_trajectory(omni):
    _, family, _, (_, _, batch), _ = omni
    old = family.behaviour_policy(batch, micro_batch_size=4)
    mask = batch.response_mask.bool()
    gap = (old.log_probs - batch.rollout_log_probs)[mask].abs().max()
    assert gap <= 1e-5, float(gap)
    ratio = torch.exp(family.log_probs(batch) - old.log_probs)[mask]
    assert torch.equal(ratio, torch.ones_like(ratio))
    # The batch as Ray carries it to a rank (pickled) and a rank's rows (select) keep their images.
    moved = pickle.loads(pickle.dumps(batch)).select([1, 0])
    again = family.behaviour_policy(moved, micro_batch_size=4)
    assert torch.allclose(again.log_probs[moved.response_mask.bool()], old.log_probs[[1, 0]][mask[[1, 0]]], atol=1e-5)


def test_a_different_image_gives_different_next_turn_logits(omni):
    model, family, _, _, _ = omni
    chat: ChatFormat = family.chat
    prompt = chat.prompt_inputs([{"role": "user", "content": "three red circles"}])
    turn = model.encode_text(CALL) + [model.eos_token_ids[0]]
    last = []
    for colour in ((255, 0, 0), (0, 0, 255)):
        fed = chat.continuation([{"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "img-1"}]}],
                                [Paint(colour)({}).image], turn_closed=True)
        ids = torch.tensor([prompt.input_ids.tolist() + turn + fed.ids])
        logits, _ = model.forward_logits(ids, torch.ones_like(ids), join_media([prompt.media, fed.media]),
                                         logits_to_keep=1)
        last.append(logits[0, -1])
    assert (last[0] - last[1]).abs().max() > 1e-3


def test_the_rollout_reads_the_image(omni):
    _, family, engine, (results, _, batch), _ = omni
    blue_results, _, blue = roll(family, engine, (0, 0, 255))
    sampled = batch.response_mask[0].bool()
    first_fed = int((~sampled).nonzero()[0])
    next_turn = first_fed + int(sampled[first_fed:].nonzero()[0])
    # The first model turn is the same (same seed, same prompt); the model's tokens after the
    # first image are scored differently.
    model_after = sampled & (torch.arange(len(sampled)) >= next_turn)
    assert torch.equal(batch.rollout_log_probs[0, :first_fed], blue.rollout_log_probs[0, :first_fed])
    assert not torch.equal(batch.rollout_log_probs[0][model_after], blue.rollout_log_probs[0][model_after])


def test_the_sample_log_shows_each_image_as_a_saved_png(omni, tmp_path):
    _, _, _, (_, trajectories, _), _ = omni
    log = tmp_path / "samples" / "agent_step_000001.jsonl"
    write_conversations(log, trajectories)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    for i, row in enumerate(rows):
        parts = [p for m in row["messages"] if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image"]
        assert [p["image"] for p in parts] == [f"agent_step_000001/{i}_image-0.png", f"agent_step_000001/{i}_image-1.png"]
        assert all((log.parent / p["image"]).is_file() for p in parts)
    assert row["images_fed"] == 2


def test_a_text_model_reads_the_tools_text_only():
    cfg = load_config(["recipe=tiny_qwen3_calculator_agent", "model.path=tiny:qwen3_tools", "rollout.sampling_options.max_new_tokens=4"])
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    family = build_family(cfg, model)
    engine = build_rollout_engine(cfg, model)
    requests = [family.request(ITEMS[0], 3)]
    results, [t] = run_trajectories(engine, requests, [ITEMS[0].prompt], [{}], family.agent, {"draw": Paint((255, 0, 0))},
                                    family.chat, decode=lambda ids: CALL)
    assert not t.images and results[0].response_media == {}
    assert all(isinstance(m["content"], str) for m in t.messages)
    assert "<tool_response>\nimg-1: drawn\n</tool_response>" in model.tokenizer.decode(results[0].response_ids.tolist())


def test_the_plan_counts_the_tokens_an_image_feeds(omni):
    from omni_rl.plan.text_steps import agent_images

    model, family, _, (_, _, batch), _ = omni
    [draw] = agent_images(family.cfg, model)["tools"]
    # The rollout's own count: an image's placeholder run and its two markers.
    start, end = (model.tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>"))
    response = batch.sequences[0, batch.prompt_width:].tolist()
    fed = (~batch.response_mask[0].bool()).tolist()
    first = next(k for k, (token, f) in enumerate(zip(response, fed)) if f and token == start)
    assert draw["tokens_per_image"] == response.index(end, first) - first + 1 == 6
    assert (draw["height"], draw["width"]) == (32, 32)
    assert draw["image_tokens_one_call_a_turn"] == 12 and draw["images_at_most"] == 256 // 6


RUN = ["recipe=tiny_qwen3_omni_draw_agent", "trainer.total_steps=1", "trainer.val_every=0", "trainer.save_every=0",
       "trainer.loggers=[jsonl]", "trainer.logger_options.progress_bar=false"]


def _train(tmp_path, *overrides):
    from omni_rl.trainer import PPOTrainer

    cfg = load_config([*RUN, f"trainer.output_dir={tmp_path}", *overrides])
    PPOTrainer(cfg).fit()
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.long  # about 20 s on a loaded 2-core machine: over the default run's budget
def test_the_recipe_trains_a_step_with_the_shape_model_as_draw_tool(tmp_path):
    # The random thinker (it rarely writes a whole call) and short turns: the recipe's pieces
    # (the draw tool on the frozen shape model, the drawn_score reward, the agent family on the
    # omni adapter) load and one on-policy step trains.
    [record] = _train(tmp_path, "model.path=tiny:qwen3_omni", "rollout.sampling_options.max_new_tokens=8",
                      "trainer.samples_per_prompt=2", "trainer.mini_batch_size=4", "trainer.micro_batch_size=4")
    assert record["step"] == 1 and record["agent/model_tokens_mean"] > 0
    assert record["actor/first_minibatch_ratio_max_abs_dev"] == 0.0
    assert record["rollout_corr/logprob_abs_diff_max"] <= 1e-5


@pytest.mark.long  # builds tiny:qwen3_omni_draw (a 5-minute cold start, once per cache), then a step
def test_the_cold_started_agent_draws_and_trains_on_what_it_saw(tmp_path):
    # val_every=1 writes the step's sample log (and validates one trajectory at steps 0 and 1).
    record = _train(tmp_path, "trainer.samples_per_prompt=8", "trainer.mini_batch_size=16", "trainer.micro_batch_size=8",
                    "trainer.val_every=1", "trainer.val_num_prompts=1", "trainer.val_samples_per_prompt=1")[-1]
    rows = [json.loads(line) for line in (tmp_path / "samples" / "agent_step_000001.jsonl").read_text().splitlines()]
    drew = [r for r in rows if r["images_fed"]]
    assert drew, "no trajectory of the step drew an image"
    assert record["agent/tool_call_rate"] > 0 and record["reward/total/mean"] > 0
    assert record["actor/first_minibatch_ratio_max_abs_dev"] == 0.0
    assert record["rollout_corr/logprob_abs_diff_max"] <= 1e-5
    image = next(p["image"] for m in drew[0]["messages"] if isinstance(m["content"], list)
                 for p in m["content"] if p["type"] == "image")
    assert (tmp_path / "samples" / image).is_file()

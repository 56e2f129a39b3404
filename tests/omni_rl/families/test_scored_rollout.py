"""`scored_rollout` on the real rollout engines: every finished sample reaches the scorer once,
with its own prompt and metadata, through the reward-input function of its family."""
import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.config.schema import ModelConfig
from omni_rl.models import build_model
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.text_native import NativeTextEngine
from omni_rl.rollout.text_types import TextRequest
from omni_rl.families import DiffusionFamily
from omni_rl.data.prompts import PromptItem
from omni_rl.families.scored_rollout import scored_rollout
from omni_rl.rollout.backends import build_rollout_engine


def test_text_responses_are_scored_with_their_prompt_and_metadata():
    model = build_model(ModelConfig(adapter="Qwen3ForCausalLM", path="tiny:qwen3"), torch.device("cpu"))
    engine = NativeTextEngine(model, max_num_seqs=2)
    prompts = ["hi", "name a colour", "a"]
    requests = [TextRequest(prompt=model.encode_prompt([{"role": "user", "content": p}]), seed=i, max_new_tokens=6)
                for i, p in enumerate(prompts)]
    metadata = [{"i": i} for i in range(3)]
    seen = []

    def score(sample, prompt, meta, future):
        seen.append((sample, prompt, meta))
        future.set_result(len(sample))

    results, futures = scored_rollout(engine, requests, prompts, metadata, score,
                                      lambda res, p, m: (res.text, p, m), timeout_s=60)
    assert [r.text for r in results] == [r.text for r in engine.generate(requests)]
    assert sorted(seen, key=lambda s: s[2]["i"]) == [(r.text, p, m) for r, p, m in zip(results, prompts, metadata)]
    assert [f.result() for f in futures] == [len(r.text) for r in results]
    # Without a scorer: the results alone.
    again, none = scored_rollout(engine, requests, prompts, metadata, None, lambda *a: a, timeout_s=60)
    assert none == [] and [r.text for r in again] == [r.text for r in results]


def test_diffusion_samples_reach_the_scorer_with_their_image_and_clean_latent():
    cfg = load_config(["recipe=tiny_sd3_flowgrpo"])
    cfg.trainer.samples_per_prompt = 1  # one sample per prompt: metadata["index"] names it
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    family, engine = DiffusionFamily(cfg, model), build_rollout_engine(cfg, model)
    seen = {}

    def score(image, prompt, meta, future):  # runs on the engine's thread as samples finish
        seen[meta["index"]] = (image, prompt, meta)
        future.set_result(float(image.float().mean()))

    try:
        items = [PromptItem(prompt="a red cube", metadata={"index": 0}), PromptItem(prompt="a sky", metadata={"index": 1})]
        batch, futures = family.rollout(engine, items, step=1, score=score)
    finally:
        engine.close()
    assert isinstance(engine, NativeDiffusionEngine) and len(futures) == len(batch) == 2
    for i, item in enumerate(items):
        image, prompt, meta = seen[i]
        assert prompt == item.prompt and torch.equal(image, batch.images[i])
        assert torch.equal(meta["latent"], batch.final_latents[i])
        assert futures[i].result() == pytest.approx(float(batch.images[i].float().mean()))

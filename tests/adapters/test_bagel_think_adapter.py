"""BAGEL's think stage (`model.stage=think`, adapters/bagel/think.py) on `tiny:bagel`: the plan's
sampling and its teacher-forced log-probs are one function, plans come from their own seeds,
the image's context holds the plan (so a changed plan changes the velocity), and what trains."""
import pytest
import torch

from adapters.bagel.think import THINK_SYSTEM_PROMPT
from omni_rl.config.schema import LoraConfig
from omni_rl.models import build_model
from tests.adapters.diffusion_suite import model_config

ADAPTER = "BagelForConditionalGeneration"
PROMPTS = ["a cat", "a red cube on a table"]
WIDTH = 6  # plan tokens


def build(**changes):
    cfg = model_config(adapter=ADAPTER, stage="think", path="tiny:bagel", max_sequence_length=16,
                       cfg_interval=[0.4, 1.0], **changes)
    return build_model(cfg, torch.device("cpu"))


@pytest.fixture(scope="module")
def model():
    return build()


def test_plans_come_from_their_own_seeds(model):
    ids, mask = model.sample_plans(PROMPTS, [11, 12], WIDTH, 1.0)
    again, again_mask = model.sample_plans(PROMPTS, [11, 12], WIDTH, 1.0)
    assert torch.equal(ids, again) and torch.equal(mask, again_mask)
    alone, alone_mask = model.sample_plans(PROMPTS[1:], [12], WIDTH, 1.0)  # batch-mates do not matter
    assert torch.equal(alone[0], ids[1]) and torch.equal(alone_mask[0], mask[1])
    other, _ = model.sample_plans(PROMPTS, [13, 14], WIDTH, 1.0)
    assert not torch.equal(other, ids)
    assert ids.shape == mask.shape == (2, WIDTH) and mask.dtype == torch.float32


def test_greedy_plans_ignore_the_seed(model):
    a, _ = model.sample_plans(PROMPTS, [1, 2], WIDTH, 0.0)
    b, _ = model.sample_plans(PROMPTS, [3, 4], WIDTH, 0.0)
    assert torch.equal(a, b)


def test_the_sampling_distribution_is_the_teacher_forced_one_exactly(model):
    """Token t was drawn from the logits of a forward that held plan tokens 0 .. t-1 only; the
    teacher-forced forward holds the whole plan. Causal masking makes them the same numbers."""
    ids, mask = model.sample_plans(PROMPTS, [5, 6], WIDTH, 1.0)
    with torch.no_grad():
        forced = model.plan_log_probs(PROMPTS, ids, mask, 1.0)
        context = model.plan_context(PROMPTS)
        for t in range(WIDTH):
            keep = torch.zeros_like(mask)
            keep[:, :t] = mask[:, :t]
            partial = torch.where(keep.bool(), ids, torch.zeros_like(ids))
            logits = model.next_token_logits(context, partial, keep)[:, t]
            sampled = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, t : t + 1]).squeeze(-1)
            rows = mask[:, t].bool()
            assert torch.equal(sampled[rows], forced[rows, t]), t


def test_plan_log_probs_are_a_distribution_and_carry_the_graph(model):
    ids, mask = model.sample_plans(PROMPTS, [5, 6], WIDTH, 1.0)
    lp = model.plan_log_probs(PROMPTS, ids, mask, 1.0)
    assert lp.dtype == torch.float32 and lp.shape == (2, WIDTH) and bool((lp <= 0).all())
    assert lp.requires_grad  # LoRA on the understanding expert


def test_the_images_context_holds_the_prompt_and_the_plan(model):
    ids = torch.tensor([[65, 66, 67, 0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    cond = model.encode_prompts_with_plans(["a cat"], ids, mask)
    row = cond["input_ids"][0][cond["text_mask"][0].bool()].tolist()
    bos, eos = model.token_ids["<|im_start|>"], model.token_ids["<|im_end|>"]
    system = model.piece(THINK_SYSTEM_PROMPT)
    assert row == system + model.piece("a cat") + [bos, 65, 66, 67, eos]
    negative = cond["negative_input_ids"][0][cond["negative_text_mask"][0].bool()].tolist()
    assert negative == system  # text CFG: the system prompt alone, as the official think mode
    # One fixed width, whatever the prompt and plan.
    longer = model.encode_prompts_with_plans(["a much longer prompt"], ids, torch.ones_like(mask))
    assert longer["input_ids"].shape == cond["input_ids"].shape


def test_a_changed_plan_changes_the_velocity(model):
    x = torch.randn(2, *model.latent_shape(32, 32), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.9])
    mask = torch.ones(2, 3)
    plans = [torch.tensor([[65, 66, 67]] * 2), torch.tensor([[65, 66, 67], [70, 71, 72]])]
    with torch.no_grad():
        v = [model.predict_velocity(x, sigma, model.encode_prompts_with_plans(["a cat"] * 2, p, mask), 4.0) for p in plans]
    assert torch.equal(v[0][0], v[1][0])
    assert not torch.allclose(v[0][1], v[1][1])


def test_lora_reaches_both_experts_and_full_tuning_both_decoders():
    lora = build(lora=LoraConfig(enabled=True, rank=4, alpha=8))
    names = {n for n, p in lora.network.named_parameters() if p.requires_grad}
    assert names and all(".lora_" in n for n in names)
    assert any("self_attn.q_proj.lora_A" in n for n in names) and any("mlp.down_proj.lora_B" in n for n in names)
    assert any("q_proj_moe_gen.lora_A" in n for n in names) and any("mlp_moe_gen.up_proj.lora_B" in n for n in names)
    assert len(names) == 2 * 14 * 2  # A and B, 7 projections of each expert, 2 layers
    full = build(lora=LoraConfig(enabled=False))
    trained = {n for n, p in full.network.named_parameters() if p.requires_grad}
    for n in ("language_model.model.layers.0.self_attn.q_proj.weight", "language_model.model.layers.1.mlp.up_proj.weight",
              "language_model.model.norm.weight", "language_model.model.layers.0.self_attn.q_proj_moe_gen.weight",
              "time_embedder.mlp.0.weight", "vae2llm.weight"):
        assert n in trained, n
    for n in ("language_model.model.embed_tokens.weight", "language_model.lm_head.weight", "latent_pos_embed.pos_embed",
              "connector.fc1.weight"):
        assert n not in trained, n

"""Routing replay on the tiny Qwen3-MoE (`adapters/qwen3_moe.py`), built and loaded back through
transformers: the native engine records every fed token's experts, the trainer replays them
(`algo.family_options.routing_replay`), and a recording that does not fit is one error naming
the sample.

The bf16 tests sample with a second copy of the weights whose attention is eager (the trainer's
is sdpa): another kernel, as a GPU rollout engine's is. On a CPU one kernel gives the tiny
routers bit-identical inputs at both batch shapes, and no route would differ to begin with."""
import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.data.prompts import PromptItem
from omni_rl.data.text_batch import TextBatch
from omni_rl.families import build_family
from omni_rl.models import build_model
from omni_rl.models.moe_routing import RoutingReplayError, differing_tokens, take_recorded
from omni_rl.rollout.text_native import NativeTextEngine

RECIPE = "recipe=tiny_qwen3_moe_grpo"


def setup(mode, dtype="float32", *more):
    cfg = load_config([RECIPE, f"model.dtype={dtype}", f"algo.family_options.routing_replay={mode}",
                       "rollout.sampling_options.max_new_tokens=24", *more])
    model = build_model(cfg.model, torch.device("cpu"))
    return cfg, model, build_family(cfg, model)


def rollout(family, sampler, prompts=6, samples=4, batch=5) -> TextBatch:
    items = [PromptItem(prompt=p) for p in family.cfg.data.prompts[:prompts]]
    pairs = [(item, 1000 * g + k) for k in range(samples) for g, item in enumerate(items)]
    requests = [family.request(item, seed, record_routes=True) for item, seed in pairs]
    results = NativeTextEngine(sampler, max_num_seqs=batch).generate(requests)
    return TextBatch.from_results(results, [item.prompt for item, _ in pairs], [{}] * len(requests),
                                  list(range(len(requests))), sampler.pad_token_id)


def scored(family, batch, micro=16):
    """The trainer's log-probs and the routes its forward used (recorded), micro-batch by micro-batch."""
    log_probs, routes = [], []
    with torch.no_grad():
        for start in range(0, len(batch), micro):
            part = batch.select(range(start, min(start + micro, len(batch))))
            with family.model.routing.recording() as layers:
                log_probs.append(family.log_probs(part))
            routes.append(take_recorded(layers, len(part)))
    return torch.cat(log_probs), torch.cat(routes)


def needed(batch):
    """Positions whose route a scored log-prob depends on: the attended tokens but each row's last."""
    mask = batch.attention_mask.bool().clone()
    mask[torch.arange(len(batch)), mask.shape[1] - 1 - mask.flip(1).int().argmax(1)] = False
    return mask


def test_requests_ask_for_routes_under_r3_only():
    for mode, asks in (("off", False), ("r2", False), ("r3", True)):
        _, model, family = setup(mode)
        request = family.request(PromptItem(prompt="Say something."), 0)
        assert request.record_routes is asks
        (result,) = NativeTextEngine(model).generate([request])
        assert (result.routes is not None) is asks


def test_the_adapter_names_its_routers_and_the_engine_records_every_fed_token():
    cfg, model, family = setup("r3")
    layout = model.routing.layout
    assert (layout.num_layers, layout.num_experts, layout.top_k, layout.norm_topk_prob) == (2, 8, 2, True)
    batch = rollout(family, model, prompts=2, samples=2, batch=3)
    assert batch.routes.dtype == torch.uint8 and batch.routes.shape[2:] == (2, 2)
    assert not (needed(batch) & ~batch.route_mask).any()  # every token a log-prob depends on
    assert not (batch.route_mask & ~batch.attention_mask.bool()).any()  # and no padding
    # Each prompt's routes are those of a whole-prompt forward of the same model (fp32).
    prompt = family.request(PromptItem(prompt=cfg.data.prompts[0]), 0).prompt.input_ids
    with torch.no_grad(), model.routing.recording() as layers:
        model.forward_logits(prompt[None], torch.ones_like(prompt[None]))
    alone = take_recorded(layers, 1)[0]
    row = batch.routes[0, batch.prompt_width - len(prompt): batch.prompt_width]
    assert not differing_tokens(alone, row, torch.ones(len(prompt), dtype=torch.bool)).any()


def test_r3_routes_as_the_rollout_did_and_narrows_the_bf16_gap():
    gaps, differ = {}, {}
    for mode in ("off", "r3"):
        cfg, model, family = setup(mode, "bfloat16")
        sampler = build_model(cfg.model, torch.device("cpu"))
        sampler.trainable_module().set_attn_implementation("eager")
        batch = rollout(family, sampler)
        log_probs, used = scored(family, batch)
        differ[mode] = int(differing_tokens(used, batch.routes, needed(batch)).sum())
        mask = batch.response_mask.bool()
        gaps[mode] = (log_probs - batch.rollout_log_probs)[mask].abs()
    assert differ["off"] > 0  # the kernels' rounding flips some routes on these seeds ...
    assert differ["r3"] == 0  # ... and none under replay, on any token or layer
    # The flipped tokens' share of the gap is gone; what is left is the kernels' rounding.
    assert gaps["r3"].mean() < gaps["off"].mean() and gaps["r3"].max() <= gaps["off"].max()


def test_off_and_r3_give_the_same_losses_in_fp32():
    losses = {}
    for mode in ("off", "r3"):
        _, model, family = setup(mode)
        batch = rollout(family, model, prompts=2, samples=4, batch=8)
        batch.old_log_probs = batch.rollout_log_probs
        batch.advantages = torch.linspace(-1, 1, len(batch))
        loss, _ = family.loss(batch, 0)
        losses[mode] = float(loss.detach())
    assert abs(losses["off"] - losses["r3"]) <= 1e-6


def test_the_router_gets_its_gradient_under_r3():
    """d(sum of log-probs)/d(router weight) under replay against a central finite difference
    (the replayed routes are fixed, so the function is smooth in the router's weights; fp32, as
    transformers' grouped expert matmul takes no float64, hence the step and tolerance)."""
    _, model, family = setup("r3")
    batch = rollout(family, model, prompts=1, samples=2, batch=2)
    weight = model.router_modules()[0].weight
    mask = batch.response_mask.bool()

    def objective():
        return family.log_probs(batch)[mask].sum()

    objective().backward()
    grad = weight.grad.clone()
    assert grad.abs().max() > 0
    # Along the gradient's direction u the derivative is |grad|; and at the largest entry.
    directions = [grad / grad.norm()]
    largest = torch.zeros_like(grad).view(-1)
    largest[grad.abs().argmax()] = 1.0
    directions.append(largest.view_as(grad))
    for u in directions:
        eps = 1e-2
        with torch.no_grad():
            weight += eps * u
            up = float(objective())
            weight -= 2 * eps * u
            down = float(objective())
            weight += eps * u
        assert (up - down) / (2 * eps) == pytest.approx(float((grad * u).sum()), rel=2e-2)


def test_activation_checkpointing_recomputes_under_the_same_replay():
    """Replayed routes that the routers would not choose (the recording shifted by 3 experts):
    the gradients with activation checkpointing equal those without, so the backward's
    recompute, after the loss's call has returned, replayed them too."""
    grads, batch = [], None
    for checkpointing in ("false", "true"):
        _, model, family = setup("r3", "float32", f"model.gradient_checkpointing={checkpointing}")
        if batch is None:
            batch = rollout(family, model, prompts=1, samples=2, batch=2)
            mask = batch.response_mask.bool()
            with torch.no_grad():
                own = family.log_probs(batch)[mask]
            batch = TextBatch(**{**batch.__dict__, "routes": ((batch.routes.long() + 3) % 8).to(torch.uint8)})
        log_probs = family.log_probs(batch)[mask]
        if checkpointing == "false":
            assert (log_probs.detach() - own).abs().max() > 1e-3  # other experts: another function
        log_probs.sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.trainable_module().named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5, msg=name)


def test_r2_replays_the_old_policy_forwards_routes():
    _, model, family = setup("r2")
    batch = rollout(family, model, prompts=2, samples=2, batch=4)
    family.behaviour_policy(batch, micro_batch_size=3)
    assert batch.old_routes.dtype == torch.uint8 and batch.old_routes.shape[:2] == batch.sequences.shape
    _, used = scored(family, batch)
    assert torch.equal(used.to(torch.uint8), batch.old_routes)
    with pytest.raises(RoutingReplayError, match="sample 0 .* has no old-policy routes"):
        family.log_probs(TextBatch(**{**batch.__dict__, "old_routes": None}))


def test_a_recording_that_does_not_fit_is_one_error_naming_the_sample():
    _, model, family = setup("r3")
    batch = rollout(family, model, prompts=2, samples=2, batch=4)
    no_routes = TextBatch(**{**batch.__dict__, "routes": None, "route_mask": None})
    with pytest.raises(RoutingReplayError, match="sample 0 .* has no recorded routes"):
        family.log_probs(no_routes)
    one_layer = TextBatch(**{**batch.__dict__, "routes": batch.routes[:, :, :1]})
    with pytest.raises(RoutingReplayError, match=r"sample 0 .*expected \[tokens, 2 MoE layers, top_k 2\]"):
        family.log_probs(one_layer)
    out_of_range = batch.routes.clone()
    out_of_range[3, batch.prompt_width - 1, 1, 0] = 9
    with pytest.raises(RoutingReplayError, match=r"sample 3 .*expert index 9 in the routes, expected 0 \.\. 7"):
        family.log_probs(TextBatch(**{**batch.__dict__, "routes": out_of_range}))
    unrecorded = batch.route_mask.clone()
    unrecorded[2] = False
    with pytest.raises(RoutingReplayError, match="sample 2 .* have no recorded route"):
        family.log_probs(TextBatch(**{**batch.__dict__, "route_mask": unrecorded}))


def test_routing_replay_options_are_checked_at_load():
    with pytest.raises(ConfigError, match="routing_replay='r4': expected one of off, r3, r2"):
        load_config([RECIPE, "algo.family_options.routing_replay=r4"])
    with pytest.raises(ConfigError, match="routing_replay=r2 with algo.old_logprob_mode=bypass"):
        load_config([RECIPE, "algo.family_options.routing_replay=r2", "algo.old_logprob_mode=bypass"])
    # Every text backend records routes now (vLLM's, or its worker extension's capture): r3 loads.
    assert load_config([RECIPE, "rollout.backend=vllm"]).algo.family_options.routing_replay == "r3"
    cfg = load_config(["recipe=tiny_qwen3_grpo", "algo.family_options.routing_replay=r3"])
    with pytest.raises(ConfigError, match="routing_replay=r3: expected a mixture-of-experts model"):
        build_family(cfg, build_model(cfg.model, torch.device("cpu")))


@pytest.mark.parametrize("mode,more", [("r3", []), ("r2", []), ("r3", ["model.lora.enabled=true", "optim.lr=1e-2"])])
def test_the_tiny_moe_recipe_trains_with_routing_replay(tmp_path, mode, more):
    import json

    from omni_rl.trainer import PPOTrainer
    from tests.tiny_runs import QUIET

    out = tmp_path / mode
    PPOTrainer(load_config([RECIPE, *QUIET, f"trainer.output_dir={out}", "trainer.total_steps=2",
                            "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4", "trainer.mini_batch_size=4",
                            "trainer.micro_batch_size=2", f"algo.family_options.routing_replay={mode}", *more])).fit()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        assert rec["actor/grad_norm"] > 0
        # The old policy and the first mini-batch route alike (the same replayed routes): ratio 1.
        assert rec["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6

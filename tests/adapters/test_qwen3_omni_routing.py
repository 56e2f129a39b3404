"""Routing replay on the tiny Qwen3-Omni thinker (a MoE text model behind an image prompt): the
native engine records its routes, media placeholders included, and under r3 the trainer's
forward routes every token and layer as the rollout did, with the same log-probs as without
replay in fp32 (the routes agree there to begin with)."""
import torch

from omni_rl.compose import load_config
from omni_rl.data.prompts import training_prompt_items
from omni_rl.data.text_batch import TextBatch
from omni_rl.families import build_family
from omni_rl.models import build_model
from omni_rl.models.moe_routing import differing_tokens, take_recorded
from omni_rl.rollout.text_native import NativeTextEngine


def test_the_thinker_records_and_replays_its_routes():
    log_probs = {}
    for mode in ("off", "r3"):
        cfg = load_config(["recipe=tiny_qwen3_omni_gspo", f"algo.family_options.routing_replay={mode}",
                           "rollout.sampling_options.max_new_tokens=6"])
        model = build_model(cfg.model, torch.device("cpu"))
        family = build_family(cfg, model)
        layout = model.routing.layout
        assert layout.num_layers == len(model.checkpointed_layers()) and layout.top_k <= layout.num_experts
        items = training_prompt_items(cfg.data)[:2]
        requests = [family.request(item, 7 * i + k, record_routes=True) for i, item in enumerate(items) for k in range(2)]
        results = NativeTextEngine(model, max_num_seqs=3).generate(requests)
        batch = TextBatch.from_results(results, [i.prompt for i in items for _ in range(2)], [{}] * 4, [0, 0, 1, 1],
                                       model.pad_token_id)
        assert batch.routes is not None and batch.routes.shape[2:] == (layout.num_layers, layout.top_k)
        with torch.no_grad(), model.routing.recording() as layers:
            log_probs[mode] = family.log_probs(batch)
        used = take_recorded(layers, len(batch))
        needed = batch.attention_mask.bool().clone()
        needed[torch.arange(4), needed.shape[1] - 1 - needed.flip(1).int().argmax(1)] = False
        assert not (needed & ~batch.route_mask).any()
        if mode == "r3":
            assert not differing_tokens(used, batch.routes, needed).any()
    mask = batch.response_mask.bool()
    torch.testing.assert_close(log_probs["r3"][mask], log_probs["off"][mask], atol=1e-6, rtol=0)

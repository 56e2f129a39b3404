"""The Ray rollout engine: requests sharded over 2 workers in chunks of one engine batch, results
in request order and equal to one process's; the futures API the diffusion family scores from."""
import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.data.prompts import PromptItem
from omni_rl.models import build_model
from omni_rl.families import DiffusionFamily
from omni_rl.rollout.backends import build_rollout_engine
from omni_rl.trainer.ray_actors import RayActorGroup

SD3 = ["recipe=tiny_sd3_flowgrpo", "trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2",
       "trainer.prompts_per_step=3", "trainer.samples_per_prompt=2", "trainer.mini_batch_size=6",
       "trainer.micro_batch_size=3", "rollout.max_num_seqs=2"]


@pytest.fixture(scope="module")
def sd3_workers(ray_local):
    cfg = load_config(SD3)
    workers = RayActorGroup(cfg)
    try:
        yield cfg, workers
    finally:
        workers.close()


def test_sharded_chunked_rollout_equals_one_process(sd3_workers):
    cfg, workers = sd3_workers
    engine = workers.rollout_engine
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    family, local_engine = DiffusionFamily(cfg, model), build_rollout_engine(cfg, model)
    try:
        prompts = [PromptItem(prompt=p) for p in ("a red cube", "a blue sphere", "a green cone")]
        requests = [family.request(item, seed=100 + i) for i, item in enumerate(prompts * 2)][:5]  # 3 + 2 per rank
        futures = engine.submit_many(requests)
        with pytest.raises(RuntimeError, match="still in flight"):
            engine.submit_many(requests)
        streamed = engine.wait(requests, futures, timeout_s=60)
        assert all(f.done() for f in futures)
        expected = local_engine.generate(requests, timeout_s=60)
    finally:
        local_engine.close()
    assert [r.prompt for r in streamed] == [r.prompt for r in requests]
    # Equal up to float rounding: the batches differ (one process packs requests 0-1, 2-3, 4; the
    # workers 0-1, 2 and 3-4) and so do thread counts, which changes the order of kernels' sums.
    for got, want in zip(streamed, expected):
        for field in ("latents", "log_probs", "final_latent"):
            torch.testing.assert_close(getattr(got, field), getattr(want, field), rtol=1e-4, atol=1e-5)
        assert (got.image.int() - want.image.int()).abs().max() <= 1
    # Waiting on futures that are not the submission in flight is refused.
    with pytest.raises(RuntimeError, match="not the submission in flight"):
        engine.wait(requests, futures, timeout_s=60)
    assert engine.generate([]) == []

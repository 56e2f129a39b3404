"""FSDP2Engine on a model with two trained modules (Wan2.2 A14B's experts, `tiny:wan22`): each
expert is sharded as a root of its own, the update equals LocalEngine's on a batch that straddles
the experts' boundary (so both get gradients), and a sharded checkpoint names every tensor by its
expert (`transformer.` / `transformer_2.`) and loads back, also into an unsharded model."""
import pytest
import torch

from omni_rl.config.schema import LoraConfig, ModelConfig, OptimConfig
from omni_rl.engine.fsdp2 import FSDP2Engine, load_sharded_trainable
from omni_rl.engine.local import LocalEngine
from adapters.wan import WanOptions
from omni_rl.models import build_model


def wan(seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(adapter="WanPipeline", path="tiny:wan22", adapter_options=WanOptions(max_sequence_length=16),
                      lora=LoraConfig(enabled=True, init="gaussian"))
    return build_model(cfg, torch.device("cpu"))


def straddling_batch(model):
    shape = model.latent_shape(32, 32, 5)
    x = torch.randn((2, *shape), generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.95, 0.3])  # one sample for each expert (boundary at 0.875)
    return x, sigma, model.encode_prompts(["a cat", "a boat"])


def loss_fn(model):
    def fn(b):
        x, sigma, cond = b
        v = model.predict_velocity(x, sigma, cond, 4.0)
        return v.square().mean(), {"loss/total": v.square().mean().detach()}

    return fn


def test_two_experts_update_like_the_local_engine(one_rank_group):
    local_model, sharded_model = wan(), wan()
    local = LocalEngine(local_model, OptimConfig(lr=1e-2))
    sharded = FSDP2Engine(sharded_model, OptimConfig(lr=1e-2))
    assert sharded.num_blocks == 4  # two blocks per expert, each expert its own root
    b = straddling_batch(local_model)
    before = {k: v.clone() for k, v in local_model.named_trainable_tensors().items()}
    for _ in range(2):
        m1 = local.forward_backward(b, loss_fn(local_model))
        m2 = sharded.forward_backward(b, loss_fn(sharded_model))
        assert float(m2["loss/total"]) == pytest.approx(float(m1["loss/total"]), rel=1e-6)
        assert float(sharded.optimizer_step()["actor/grad_norm"]) == pytest.approx(float(local.optimizer_step()["actor/grad_norm"]), rel=1e-5)
    want, got = local_model.named_trainable_tensors(), sharded.full_trainable_tensors()
    assert sorted(got) == sorted(want)
    assert {k.split(".")[0] for k in want} == {"transformer", "transformer_2"}
    for expert in ("transformer", "transformer_2"):  # both experts moved
        assert any(not torch.equal(want[k], before[k]) for k in want if k.startswith(expert + "."))
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_two_experts_sharded_checkpoint_round_trip(one_rank_group, tmp_path):
    model = wan()
    engine = FSDP2Engine(model, OptimConfig(lr=1e-2))
    b = straddling_batch(model)
    engine.forward_backward(b, loss_fn(model))
    engine.optimizer_step()
    saved = engine.full_trainable_tensors()
    engine.save_sharded(str(tmp_path / "ckpt"))
    engine.forward_backward(b, loss_fn(model))
    engine.optimizer_step()
    engine.load_sharded(str(tmp_path / "ckpt"))
    for k, v in engine.full_trainable_tensors().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0)
    plain = wan(seed=1)
    load_sharded_trainable(plain, str(tmp_path / "ckpt"))
    for k, v in plain.named_trainable_tensors().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0)

"""FSDP2Engine on a one-rank gloo group: the same update as LocalEngine, mixed precision,
offload flags, sharded checkpoints that load back (and into an unsharded model for export)."""
import pytest
import torch

from omni_rl.config.schema import LoraConfig, ModelConfig, OptimConfig
from omni_rl.device import dist_backend
from omni_rl.engine.fsdp2 import FSDP2Engine, load_sharded_trainable
from omni_rl.engine.local import LocalEngine
from omni_rl.models import build_model


def tiny(lora: bool, dtype: str = "float32", seed: int = 0, checkpointing: bool = False):
    torch.manual_seed(seed)
    cfg = ModelConfig(adapter="Qwen3ForCausalLM", path="tiny:qwen3", dtype=dtype, lora=LoraConfig(enabled=lora))
    model = build_model(cfg, torch.device("cpu"))
    # Set after loading: the engine's own activation checkpointing is under test, not the
    # adapter's switch (which transformers honours only in train mode).
    model.cfg.gradient_checkpointing = checkpointing
    return model


def batch(model):
    ids = model.encode_prompt([{"role": "user", "content": "hello there"}]).input_ids
    seq = torch.stack([ids, ids.flip(0)])
    return seq, torch.ones_like(seq)


def loss_fn(model):
    def fn(b):
        seq, mask = b
        lp = model.token_log_probs(seq, mask, seq.shape[1] // 2, 1.0)
        return -lp.float().mean(), {"loss/total": lp.mean().detach()}

    return fn


def test_dist_backend_per_device():
    assert dist_backend(torch.device("cpu")) == "gloo"
    assert dist_backend(torch.device("cuda", 0)) == "nccl"
    assert dist_backend("npu:0") == "hccl"  # a name: torch knows "npu" only with torch_npu
    with pytest.raises(ValueError, match="meta"):
        dist_backend(torch.device("meta"))


def test_needs_a_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        FSDP2Engine(tiny(lora=True), OptimConfig())


@pytest.mark.parametrize("lora,checkpointing", [(False, False), (True, False), (False, True)])
def test_one_rank_update_matches_local_engine(one_rank_group, lora, checkpointing):
    local_model, sharded_model = tiny(lora), tiny(lora, checkpointing=checkpointing)
    local = LocalEngine(local_model, OptimConfig(lr=1e-2))
    sharded = FSDP2Engine(sharded_model, OptimConfig(lr=1e-2))
    if not lora:  # (the adapter finds its decoder layers only without the PEFT wrapper)
        assert sharded.num_blocks == 2  # one fully_shard per decoder layer, then the root
    b = batch(local_model)
    for _ in range(2):
        m1 = local.forward_backward(b, loss_fn(local_model), loss_scale=0.5)
        m2 = sharded.forward_backward(b, loss_fn(sharded_model), loss_scale=0.5)
        assert float(m2["loss/total"]) == pytest.approx(float(m1["loss/total"]), rel=1e-6)
        s1, s2 = local.optimizer_step(), sharded.optimizer_step()
        assert float(s2["actor/grad_norm"]) == pytest.approx(float(s1["actor/grad_norm"]), rel=1e-5)
    want = {k: v for k, v in local_model.named_trainable_tensors().items()}
    got = sharded.full_trainable_tensors()
    assert sorted(got) == sorted(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lora", [True, False])
def test_bf16_mixed_precision_and_offload_flags_train(one_rank_group, lora):
    model = tiny(lora=lora, dtype="bfloat16")
    engine = FSDP2Engine(model, OptimConfig(lr=1e-2), param_offload=True, optimizer_offload=True)
    # The sharded master weights are fp32; forwards run in bf16.
    assert all(p.dtype == torch.float32 for p in engine.params)
    before = {k: v.clone() for k, v in engine.full_trainable_tensors().items()}
    engine.forward_backward(batch(model), loss_fn(model))
    assert engine.optimizer_step()["actor/grad_norm"] > 0
    after = engine.full_trainable_tensors()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_sharded_checkpoint_round_trip_and_export(one_rank_group, tmp_path):
    model = tiny(lora=True)
    engine = FSDP2Engine(model, OptimConfig(lr=1e-2))
    engine.forward_backward(batch(model), loss_fn(model))
    engine.optimizer_step()
    saved = engine.full_trainable_tensors()
    engine.save_sharded(str(tmp_path / "ckpt"))

    engine.forward_backward(batch(model), loss_fn(model))
    engine.optimizer_step()  # move away from the saved weights ...
    engine.load_sharded(str(tmp_path / "ckpt"))  # ... and back
    for k, v in engine.full_trainable_tensors().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0)
    assert len(engine.optimizer.state) > 0

    plain = tiny(lora=True, seed=1)  # another LoRA init, overwritten by the checkpoint
    load_sharded_trainable(plain, str(tmp_path / "ckpt"))
    for k, v in plain.named_trainable_tensors().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0)


@pytest.mark.long
@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_blocks_shard_and_train_as_the_eager_local_engine(one_rank_group, checkpointing):
    """torchtitan's order: each decoder layer compiled (`model.compile_options`, at load), then the
    engine checkpoints and shards it; the update is eager's. `aot_eager` captures the graphs with
    eager kernels (inductor's numerics: the shared adapter suite, tests/adapters/diffusion_suite.py)."""
    from omni_rl.models.compile import CompileOptions, compiled_graphs

    torch._dynamo.reset()  # graphs another test compiled for these layers' code would be reused
    local_model = tiny(lora=False)
    torch.manual_seed(0)
    cfg = ModelConfig(adapter="Qwen3ForCausalLM", path="tiny:qwen3", lora=LoraConfig(enabled=False),
                      compile_options=CompileOptions(enabled=True, backend="aot_eager"))
    sharded_model = build_model(cfg, torch.device("cpu"))
    sharded_model.cfg.gradient_checkpointing = checkpointing
    layers = [m for m in sharded_model.trainable_root().modules() if isinstance(m, sharded_model.compile_block_classes())]
    assert len(layers) == 2 and all(m._compiled_call_impl is not None for m in layers)
    local = LocalEngine(local_model, OptimConfig(lr=1e-2))
    sharded = FSDP2Engine(sharded_model, OptimConfig(lr=1e-2))
    assert sharded.num_blocks == 2
    before = compiled_graphs()
    b = batch(local_model)
    for _ in range(2):
        m1 = local.forward_backward(b, loss_fn(local_model))
        m2 = sharded.forward_backward(b, loss_fn(sharded_model))
        assert float(m2["loss/total"]) == pytest.approx(float(m1["loss/total"]), rel=1e-5)
        s1, s2 = local.optimizer_step(), sharded.optimizer_step()
        assert float(s2["actor/grad_norm"]) == pytest.approx(float(s1["actor/grad_norm"]), rel=1e-4)
    assert compiled_graphs() > before  # the layers ran compiled, not eager
    want, got = local_model.named_trainable_tensors(), sharded.full_trainable_tensors()
    assert sorted(got) == sorted(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5)

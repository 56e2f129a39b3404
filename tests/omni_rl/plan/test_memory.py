"""`omni_rl.plan.memory`: one rank's weights, gradients and optimizer state, by hand and against
torch's own FSDP2 shards and AdamW state."""
import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from omni_rl.plan.memory import TensorSpec, fsdp2_local_numel, weight_memory


def test_local_numel_by_hand():
    assert fsdp2_local_numel((7, 10), 4) == 2 * 10  # 7 rows padded to 8: 2 per rank
    assert fsdp2_local_numel((3,), 4) == 1  # fewer rows than ranks: one padded row each
    assert fsdp2_local_numel((8, 2, 3), 1) == 48
    assert fsdp2_local_numel((), 8) == 1
    with pytest.raises(ValueError, match="world_size=0"):
        fsdp2_local_numel((4,), 0)


@pytest.fixture
def fake_group():
    """A process group of `world_size` ranks in this one process (torch's fake backend: the
    collectives do nothing, the sharding is real); this process is rank 0."""
    def init(world_size):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_local_numel_equals_fully_shard(fake_group, world_size):
    fake_group(world_size)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3), torch.nn.Embedding(5, 2))
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for block in model:
        fully_shard(block)
    fully_shard(model)
    for name, param in model.named_parameters():
        # Rank 0 holds the full ceil(rows / N) share: the padded size every rank allocates.
        assert param.to_local().numel() == fsdp2_local_numel(shapes[name], world_size), name


def test_weight_memory_by_hand():
    tensors = [
        TensorSpec("base.weight", (8, 4), torch.bfloat16, trainable=False, sharded=True),  # 4x4 x 2 B = 32
        TensorSpec("lora_A", (6, 2), torch.float32, trainable=True, sharded=True),  # 3x2 x 4 B = 24
        TensorSpec("text_encoder.w", (3, 3), torch.bfloat16, trainable=False, sharded=False),  # 9 x 2 B = 18
    ]
    m = weight_memory(tensors, world_size=2)
    assert (m.frozen_weights, m.trainable_weights, m.gradients, m.optimizer_state) == (50, 24, 24, 48)
    assert (m.host_weights, m.host_gradients, m.host_optimizer_state) == (0, 0, 4)  # AdamW's step scalar
    assert m.device_total == 146

    offload = weight_memory(tensors, world_size=2, param_offload=True)
    assert (offload.frozen_weights, offload.trainable_weights, offload.gradients, offload.optimizer_state) == (18, 0, 0, 0)
    assert (offload.host_weights, offload.host_gradients, offload.host_optimizer_state) == (56, 24, 52)

    optim_only = weight_memory(tensors, world_size=2, optimizer_offload=True)
    assert (optim_only.optimizer_state, optim_only.host_optimizer_state) == (0, 52)
    assert optim_only.gradients == 24


def test_optimizer_state_equals_adamw_after_a_step():
    """The state torch's AdamW keeps after one step, counted from the real tensors."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))
    model[1].requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model(torch.randn(4, 5)).sum().backward()
    optimizer.step()
    state = [t for s in optimizer.state.values() for t in s.values()]
    real = sum(t.numel() * t.element_size() for t in state)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    specs = [TensorSpec(n, tuple(p.shape), p.dtype, p.requires_grad, sharded=True) for n, p in model.named_parameters()]
    m = weight_memory(specs, world_size=1)
    assert m.optimizer_state + m.host_optimizer_state == real
    assert m.gradients == grads
    assert m.trainable_weights == sum(p.numel() * 4 for p in model[0].parameters())
    assert m.frozen_weights == sum(p.numel() * 4 for p in model[1].parameters())

"""`RolloutEngine.sync_weights`: an engine receives every version unless it declares that it
samples with the trainer's model itself (`shares_model_with`).

The in-process vLLM engines keep the trainer's adapter beside their own copy of the weights (for
request checks, the tokenizer, LoRA targets). An engine like that must still be sent each new
version: what decides is the engine's declaration, never the name of one of its attributes.
"""
from __future__ import annotations

import torch

from omni_rl.rollout.base import SynchronousRolloutEngine


class _CopyKeepingEngine(SynchronousRolloutEngine):
    """Samples with a copy of the weights of its own, and keeps the trainer's adapter as
    `self.model` for its bookkeeping, as an in-process vLLM engine does. Its "sample" is the sum
    of its copy's weights, so a result shows which weights it was drawn with."""

    def __init__(self, model):
        self.model = model
        self.weights: dict[str, torch.Tensor] = {}
        self.received: list[tuple[int, str]] = []

    def generate(self, requests, timeout_s=None):
        total = sum(float(t.double().sum()) for t in self.weights.values())
        return [(total, self.weight_version) for _ in requests]

    def update_weights(self, tensors, version, kind):
        self.weights = {name: t.detach().clone() for name, t in dict(tensors).items()}
        self.received.append((version, kind))
        self.weight_version = version


def _weights_sum(model) -> float:
    return sum(float(t.double().sum()) for t in model.named_trainable_tensors().values())


def test_every_pushed_version_reaches_an_engine_that_keeps_the_trainers_adapter(make_sd3):
    model = make_sd3()
    engine = _CopyKeepingEngine(model)
    engine.update_weights(model.named_trainable_tensors(), 0, "lora")  # start from the trainer's weights
    gen = torch.Generator().manual_seed(0)
    for version in (1, 2, 3):
        with torch.no_grad():
            for p in model.trainable_parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
        engine.sync_weights(model, version)
        assert [v for v, _ in engine.received] == list(range(version + 1))  # on the old rule: [0]
        ((sampled_sum, sampled_version),) = engine.generate(["a prompt"])
        assert sampled_version == version
        # The sample was drawn with this version's weights, not the base policy's.
        assert abs(sampled_sum - _weights_sum(model)) <= 1e-6 * max(1.0, abs(sampled_sum))
    assert engine.received == [(0, "lora"), (1, "lora"), (2, "lora"), (3, "lora")]
    for name, value in model.named_trainable_tensors().items():
        torch.testing.assert_close(engine.weights[name], value, atol=0, rtol=0, msg=name)
    assert not engine.shares_model_with(model)  # the default: a copy of its own


def test_an_engine_that_declares_it_shares_the_model_only_records_the_version(make_sd3):
    model, other = make_sd3(), make_sd3()

    class Sharing(_CopyKeepingEngine):
        def shares_model_with(self, candidate) -> bool:
            return candidate is self.model

    engine = Sharing(model)
    engine.sync_weights(model, 4)
    assert engine.weight_version == 4 and engine.received == []
    engine.sync_weights(other, 5)  # another model object: its weights are sent
    assert engine.weight_version == 5 and engine.received == [(5, "lora")]

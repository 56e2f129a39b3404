"""Every registered rollout backend samples with the trainer's current weights after `sync_weights`.

For each backend of `ROLLOUT_BACKENDS` (the registry, so a new one is tested too) and each model
kind (the tiny SD3, the tiny Qwen3), the engine is built as the trainer builds it, on the
trainer's model; the trainer then changes its weights and syncs, twice. After each sync the
engine reports that version, its results carry it, and they are samples of the trainer's
current weights (diffusion: the native engine's samples of the same seeded requests; text: the
trainer's log-probs of the sampled tokens); an engine with a copy of its own was sent exactly the
trainer's trainable tensors. A backend that cannot run here (vLLM missing on a CPU) or
takes no model of that kind is skipped with its own reason.

The engine's `shares_model_with` and the spec's `shares_model` must say the same of the model
the engine is built on: the trainer reads the spec (whether a pipelined run needs a copy), the
sync reads the engine.
"""
from __future__ import annotations

import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.errors import OmniConfigError
from omni_rl.models import build_model
from omni_rl.rollout.backends import ROLLOUT_BACKENDS
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.types import DiffusionRequest
from tests.omni_rl.rollout.vllm_text_requests import requests as text_requests, trainer_log_probs
from tests.tiny_runs import TINY_QWEN3, TINY_SD3

KINDS = {"sd3": ["recipe=tiny_sd3_flowgrpo", *TINY_SD3], "qwen3": TINY_QWEN3}
TIMEOUT_S = 120.0  # generous: a server backend starts a process; a hang still fails the test


def _requests(kind: str, model) -> list:
    if kind == "sd3":
        return [DiffusionRequest(f"a shape {i}", seed=i, height=32, width=32, num_steps=3, guidance_scale=4.5,
                                 sde_window_size=1, sde_window_range=(0, 2)) for i in range(2)]
    return text_requests(model, 2)


def _assert_sampled_with(kind: str, model, requests, results) -> None:
    """The results are what `model`'s current weights give: for diffusion, the native engine's
    samples of the same seeded requests (every backend samples with the adapter's own maths,
    seeded per request); for text, whose sampler's random stream is the engine's own, the
    trainer's log-probs of each sampled response (teacher forcing)."""
    if kind == "sd3":
        engine = NativeDiffusionEngine(model, driver="caller")
        try:
            want = engine.generate(requests, timeout_s=TIMEOUT_S)
        finally:
            engine.close()
        for a, b in zip(results, want, strict=True):
            # One update moves these final latents by ~10 (measured): a stale version cannot pass,
            # and a GPU engine's kernels have room.
            torch.testing.assert_close(a.final_latent, b.final_latent, atol=1e-2, rtol=0)
        return
    for result in results:
        # The engine decodes token by token, the trainer in one forward: close, not equal (one
        # update moves these log-probs by order 1).
        torch.testing.assert_close(result.log_probs, trainer_log_probs(model, result), atol=1e-2, rtol=0)


def _sample_signature(kind: str, results) -> torch.Tensor:
    return torch.cat([(r.final_latent if kind == "sd3" else r.log_probs).flatten() for r in results])


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("backend", ROLLOUT_BACKENDS.names())
def test_sync_weights_reaches_every_backend(backend, kind, tmp_path):
    try:
        cfg = load_config([*KINDS[kind], f"rollout.backend={backend}", f"trainer.output_dir={tmp_path}"])
    except OmniConfigError as err:
        pytest.skip(f"rollout.backend={backend} takes no tiny {kind} run: {err}")
    spec = ROLLOUT_BACKENDS.get(backend)
    torch.manual_seed(cfg.trainer.seed)
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    try:
        engine = spec.build(cfg, model)
    except OmniConfigError as err:  # e.g. vLLM is not installed here
        pytest.skip(str(err))
    except TypeError as err:
        if "has no engine for" not in str(err):
            raise
        pytest.skip(str(err))
    sent: list[tuple[int, dict[str, torch.Tensor]]] = []
    forward = engine.update_weights

    def record(tensors, version, kind_):
        tensors = dict(tensors)
        sent.append((version, {name: t.clone() for name, t in tensors.items()}))
        forward(tensors, version, kind_)

    engine.update_weights = record
    try:
        assert engine.shares_model_with(model) == spec.shares_model, (
            f"rollout backend {backend!r}: its spec says shares_model={spec.shares_model}, its engine "
            f"{type(engine).__name__}.shares_model_with(the model it was built on) says the opposite")
        requests = _requests(kind, model)
        before = engine.generate(requests, timeout_s=TIMEOUT_S)
        gen = torch.Generator().manual_seed(1)
        for version in (1, 2):
            with torch.no_grad():  # an update of the trainer's weights
                for p in model.trainable_parameters():
                    p.add_(0.3 * torch.randn(p.shape, generator=gen))
            engine.sync_weights(model, version)
            assert engine.weight_version == version
            results = engine.generate(requests, timeout_s=TIMEOUT_S)
            assert [r.weight_version for r in results] == [version] * len(requests)
            _assert_sampled_with(kind, model, requests, results)
            if not spec.shares_model:  # its own copy: this version's weights were sent to it
                assert sent[-1][0] == version
                trained = model.named_trainable_tensors()
                assert sent[-1][1].keys() == trained.keys() and trained
                for name, value in trained.items():
                    torch.testing.assert_close(sent[-1][1][name], value, atol=0, rtol=0, msg=name)
        assert [v for v, _ in sent] == ([] if spec.shares_model else [1, 2])
        # The updates mattered: the last samples are not the first ones.
        assert not torch.allclose(_sample_signature(kind, results), _sample_signature(kind, before), atol=1e-3)
    finally:
        engine.close()

"""`--plan`'s traced activations against what an accelerator allocates (`gpu` marker: CUDA by
default, see tests/conftest.py): for each tiny recipe with a traced forward, in bf16, the fake-
tensor plan of the rollout forward and of the training micro-batch is within 10% of the peak the
allocator reports for the same pass on the device.

The measured pass is the planner's own (`trace`'s forward, and backward of the first output's
mean), run on real device tensors after one warm-up pass, so that what the first pass allocates
once and keeps (cuBLAS workspaces, attention kernels' scratch caches) is in the baseline rather
than counted as activations. The trainable parameters' gradients are left out of the measured
peak as the plan leaves them out (it plans them per rank). On `OMNI_RL_ACCEL_TEST_DEVICE=cpu`
there is no allocator to read: the test is skipped (the CPU check is test_planner.py's).
"""
import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.plan.architecture import architecture_folder
from omni_rl.plan.planner import _spec
from omni_rl.plan.steps import trace_step
from omni_rl.plan.trace import materialize
from omni_rl.plan.weights import build_weightless
from tests.omni_rl.plan.test_planner import TRACED_TINY

pytestmark = pytest.mark.gpu


def _first(out):
    first = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", None)
    if first is None:
        first = out.sample if hasattr(out, "sample") else out
    return first


def measured_peak(module, make_inputs, backward: bool, device: str) -> int:
    """Bytes the device allocates for one pass above what it held before, less the trainable
    parameters' gradients."""
    def one_pass():
        grad = torch.enable_grad() if backward else torch.no_grad()
        with grad:
            with torch.device(device):
                inputs = make_inputs()
            out = module(**inputs)
            first = _first(out)
            if backward:
                first.float().mean().backward()
            del out, first, inputs

    one_pass()  # warm-up: workspaces and caches allocated once
    for p in module.parameters():
        p.grad = None
    torch.accelerator.synchronize()
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    one_pass()
    torch.accelerator.synchronize()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in module.parameters() if p.grad is not None)
    for p in module.parameters():
        p.grad = None
    return torch.accelerator.max_memory_allocated() - base - grads


@pytest.mark.parametrize("recipe", TRACED_TINY)
def test_the_plan_is_within_ten_percent_of_the_allocators_peak(recipe, tmp_path, accel_device):
    if accel_device == "cpu":
        pytest.skip("no device allocator on the CPU (test_planner.py checks the plan against real CPU tensors)")
    cfg = load_config([f"recipe={recipe}", "model.dtype=bfloat16", f"trainer.output_dir={tmp_path}"])
    folder = architecture_folder(cfg.model.path)
    spec = _spec(cfg)
    plan = trace_step(build_weightless(cfg, folder).model, spec, cfg, fake=True)

    model = build_weightless(cfg, folder).model
    for name, module in model.trainable_modules().items():
        materialize(module, fake=False)
        with torch.no_grad():  # finite values: uninitialised memory may hold NaNs that change no shape but slow kernels
            for t in [*module.parameters(), *module.buffers()]:
                if t.is_floating_point():
                    t.normal_(0.0, 0.02)
        module.to(accel_device)
    for planned, batch, backward in ((plan.rollout, plan.rollout_batch, False), (plan.train, plan.train_batch, True)):
        peaks = []
        for name, module in model.trainable_modules().items():
            module.train(backward and cfg.model.gradient_checkpointing)
            peaks.append(measured_peak(module, lambda: spec.forward_inputs(model, cfg, batch)[name], backward, accel_device))
            module.eval()
        measured = max(peaks)
        assert measured > 0
        assert abs(planned.activation_bytes - measured) <= 0.10 * measured, (
            recipe, "train" if backward else "rollout", planned.activation_bytes, measured)

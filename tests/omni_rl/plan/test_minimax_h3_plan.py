"""`--plan` on the tiny MiniMax-H3 recipe: the fake-tensor trace of its transformer's packed
forward equals the same trace on real tensors (as tests/omni_rl/plan/test_planner.py checks for
the other traced tiny recipes), and the plan prints for it."""
from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.plan.architecture import architecture_folder
from omni_rl.plan.planner import _spec
from omni_rl.plan.steps import trace_step
from omni_rl.plan.weights import build_weightless, weights_of

RECIPE = "tiny_minimax_h3_flowgrpo"


def test_fake_trace_equals_the_real_tensor_trace(tmp_path):
    cfg = load_config([f"recipe={RECIPE}", f"trainer.output_dir={tmp_path}"])
    folder = architecture_folder(cfg.model.path)
    fake_built, real_built = build_weightless(cfg, folder), build_weightless(cfg, folder)
    assert weights_of(cfg, folder, fake_built)["per_device_bytes"] == weights_of(cfg, folder, real_built)["per_device_bytes"]
    fake = trace_step(fake_built.model, _spec(cfg), cfg, fake=True)
    real = trace_step(real_built.model, _spec(cfg), cfg, fake=False)
    assert fake.rollout.flops == real.rollout.flops > 0
    assert fake.train.flops == real.train.flops > 0
    for f, r in ((fake.rollout, real.rollout), (fake.train, real.train)):
        assert r.activation_bytes > 0
        assert abs(f.activation_bytes - r.activation_bytes) <= 0.05 * r.activation_bytes, (f, r)


def test_the_plan_prints(tmp_path, capsys):
    assert main([f"recipe={RECIPE}", f"trainer.output_dir={tmp_path}", "--plan"]) in (0, None)
    out = capsys.readouterr().out
    assert "plan: tiny_minimax_h3_flowgrpo (MiniMaxH3ModularPipeline, tiny:minimax_h3)" in out
    # Guidance-distilled: one row per sample (no CFG doubling) in the traced rollout forward.
    assert "traced (fake tensors): rollout forward of 16 rows" in out

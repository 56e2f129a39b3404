"""`--plan` on the tiny MiniMax-H3 recipe prints (its fake-tensor trace equals the real one in
tests/omni_rl/plan/test_planner.py, with the other traced tiny recipes)."""
from omni_rl.cli import main

RECIPE = "tiny_minimax_h3_flowgrpo"


def test_the_plan_prints(tmp_path, capsys):
    assert main([f"recipe={RECIPE}", f"trainer.output_dir={tmp_path}", "--plan"]) in (0, None)
    out = capsys.readouterr().out
    assert "plan: tiny_minimax_h3_flowgrpo (MiniMaxH3ModularPipeline, tiny:minimax_h3)" in out
    # Guidance-distilled: one row per sample (no CFG doubling) in the traced rollout forward.
    assert "traced (fake tensors): rollout forward of 16 rows" in out

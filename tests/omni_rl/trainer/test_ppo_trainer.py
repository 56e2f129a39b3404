"""End-to-end checks of the PPO trainer on the tiny SD3 (CPU, a few seconds per run)."""
import json
import uuid

import pytest
import torch
from safetensors.torch import load_file

from omni_rl.compose import load_config
from omni_rl.reward import register_reward
from omni_rl.reward.manager import RewardError
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import TINY_SD3


def run_tiny(tmp_path, name, *overrides):
    cfg = load_config([*TINY_SD3, f"trainer.output_dir={tmp_path / name}", *overrides])
    trainer = PPOTrainer(cfg)
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return trainer, records


def test_on_policy_ratio_is_one_and_rollout_matches_trainer(tmp_path):
    _, records = run_tiny(tmp_path, "run", "trainer.total_steps=2")
    for rec in records:
        # Before the step's first optimizer update, recomputed old log-probs equal the current ones.
        assert rec["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6
        assert rec["rollout_corr/logprob_abs_diff_max"] <= 1e-5
        # Two mini-batches per step: the second one sees the first update, so some ratio moved.
        assert rec["actor/num_updates"] == 2
    assert records[-1]["loss/ratio_max_abs_dev"] > 0


@pytest.mark.long  # dynamo's tracing alone takes minutes on a loaded 2-core machine
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_on_policy_ratio_is_one_and_nothing_recompiles_after_the_first_step(tmp_path, backend):
    """The rollout (no-grad graphs) and the update (training graphs) run compiled blocks: the
    rollout's log-probs still serve as the old ones, the first mini-batch's ratio is 1 within the
    eager bound, and the graphs compiled in step 1 serve every later batch (`aot_eager`: graph
    capture with eager kernels; inductor: its generated kernels)."""
    _, records = run_tiny(tmp_path, backend, "trainer.total_steps=3", "model.compile_options.enabled=true",
                          f"model.compile_options.backend={backend}", "trainer.samples_per_prompt=3",
                          "trainer.mini_batch_size=3", "trainer.micro_batch_size=1")
    for rec in records:
        assert rec["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6
        assert rec["rollout_corr/logprob_abs_diff_max"] <= 1e-5
    graphs = [rec["perf/compiled_graphs"] for rec in records]
    assert graphs[0] > 0 and graphs == [graphs[0]] * len(graphs)  # rollouts of 6, micro-batches of 1: no recompile


def test_resume_is_exact(tmp_path):
    straight, _ = run_tiny(tmp_path, "straight", "trainer.total_steps=4")
    run_tiny(tmp_path, "split", "trainer.total_steps=2")
    resumed, records = run_tiny(
        tmp_path, "split", "trainer.total_steps=4", f"trainer.resume={tmp_path / 'split'}"
    )
    a = straight.model.named_trainable_tensors()
    b = resumed.model.named_trainable_tensors()
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=0, msg=name)
    # The resumed run continued the metrics file instead of starting it again.
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    # Training moved the weights at all (else the comparison above proves nothing).
    assert any(float(t.abs().max()) > 0 for n, t in a.items() if "lora_B" in n)


def test_outputs_a_user_expects(tmp_path):
    run_tiny(tmp_path, "out", "trainer.total_steps=2", "trainer.val_every=1", "algo.family_options.val_num_steps=4",
             "trainer.loggers=[jsonl,tensorboard]")
    out = tmp_path / "out"
    assert (out / "samples" / "val_step_000000.png").is_file()
    assert (out / "samples" / "val_step_000002.png").is_file()
    assert (out / "reward_curve.png").is_file()
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "checkpoints" / "step_000002" / "trainer_state.json").is_file()
    lora = load_file(out / "lora" / "pytorch_lora_weights.safetensors")
    assert lora and all(k.startswith("transformer.") for k in lora)
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ["reward/total/mean", "loss/policy", "loss/clipfrac", "loss/approx_kl", "actor/grad_norm",
                "timing/step", "perf/samples_per_s", "val/reward/total/mean"]:
        assert key in rec, key


def test_validation_scores_with_its_own_rewards_when_given(tmp_path):
    run_tiny(tmp_path, "val", "trainer.total_steps=1", "trainer.val_every=1", "algo.family_options.val_num_steps=4",
             "reward.rewards=[{name: brightness}]", "reward.val_rewards=[{name: jpeg_compressibility}]")
    for name in ("val_step_000000.jsonl", "val_step_000001.jsonl"):
        rows = [json.loads(line) for line in (tmp_path / "val" / "samples" / name).read_text().splitlines()]
        assert rows and all(set(row["scores"]) == {"jpeg_compressibility"} for row in rows)
        assert all(row["reward"] == row["scores"]["jpeg_compressibility"] for row in rows)


def test_lora_output_loads_into_diffusers_pipeline(tmp_path):
    trainer, _ = run_tiny(tmp_path, "lora", "trainer.total_steps=1")
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(trainer.model.path, text_encoder_3=None, tokenizer_3=None)
    pipe.load_lora_weights(str(tmp_path / "lora" / "lora"))
    names = [n for n, _ in pipe.transformer.named_parameters() if "lora" in n]
    assert names, "load_lora_weights added no LoRA layers"
    trained = trainer.model.named_trainable_tensors()
    loaded = dict(pipe.transformer.named_parameters())
    for name, value in trained.items():
        key = name.replace(".default.", ".default_0.")
        torch.testing.assert_close(loaded[key].float(), value.float(), msg=name)


def test_kl_and_bypass_modes_run(tmp_path):
    # One step of two mini-batches, at kl_coef 0.04 and 0.08. LoRA's B starts at 0, so before the
    # first update the actor is its reference (LoRA off) to the last bit: the first mini-batch's
    # KL, ||mean - ref_mean||^2 / (2 std^2 dt) per step, is 0 and so is its gradient. The first
    # update is then the policy loss's alone at either coefficient, and the second mini-batch sees
    # the same weights: the same KL k > 0 and policy loss p, with total = p + kl_coef * k.
    _, (a,) = run_tiny(tmp_path, "kl", "trainer.total_steps=1", "algo.kl_coef=0.04", "algo.old_logprob_mode=bypass")
    _, (b,) = run_tiny(tmp_path, "kl2", "trainer.total_steps=1", "algo.kl_coef=0.08", "algo.old_logprob_mode=bypass")
    assert a["loss/kl"] > 0  # the second mini-batch's weights left the reference
    assert b["loss/kl"] == pytest.approx(a["loss/kl"], rel=1e-4)
    assert b["loss/policy"] == pytest.approx(a["loss/policy"], rel=1e-4, abs=1e-7)
    # The metrics are means over the same micro-batch steps, so the sum carries over to them.
    assert a["loss/total"] == pytest.approx(a["loss/policy"] + 0.04 * a["loss/kl"], rel=1e-5, abs=1e-7)
    assert b["loss/total"] == pytest.approx(b["loss/policy"] + 0.08 * b["loss/kl"], rel=1e-5, abs=1e-7)
    # bypass: the old log-probs are the rollout's, equal to the actor's before its first update.
    assert a["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-5


def test_a_failing_reward_fails_the_step_with_its_name(tmp_path):
    name = f"tests.trainer.broken_{uuid.uuid4().hex[:8]}"

    @register_reward(name)
    def broken():
        def score(images, prompts, metadata):
            raise RuntimeError("scorer backend unreachable")

        return score

    with pytest.raises(RewardError, match=name):
        run_tiny(tmp_path, "broken", "trainer.total_steps=1", f"reward.rewards=[{{name: '{name}'}}]")


def test_a_nan_reward_is_an_error(tmp_path):
    name = f"tests.trainer.nan_{uuid.uuid4().hex[:8]}"

    @register_reward(name)
    def nan_reward():
        return lambda images, prompts, metadata: [float("nan")] * len(prompts)

    with pytest.raises(RewardError, match="nan|NaN"):
        run_tiny(tmp_path, "nan", "trainer.total_steps=1", f"reward.rewards=[{{name: '{name}'}}]")


def test_real_ocr_reward_end_to_end(tmp_path):
    pytest.importorskip("rapidocr_onnxruntime")
    cfg = load_config(["recipe=tiny_sd3_flowgrpo_ocr", f"trainer.output_dir={tmp_path / 'ocr'}", "trainer.total_steps=1",
                       "trainer.val_every=0", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]"])
    PPOTrainer(cfg).fit()
    rec = json.loads((tmp_path / "ocr" / "metrics.jsonl").read_text().splitlines()[-1])
    # A random generator writes nothing legible: OCR accuracy is a real number in [0, 1], near 0.
    assert 0.0 <= rec["reward/ocr/mean"] <= 1.0


def test_a_moving_sde_window_trains_and_resumes_exactly(tmp_path):
    """rollout.sampling_options.sde_window_schedule=random draws one window per step from (seed, step), so a
    resumed run trains the windows an uninterrupted one does; decay changes the window's size
    between steps (2 then 1 denoising steps trained)."""
    window = ["rollout.sampling_options.sde_window_schedule=random", "trainer.total_steps=3"]
    straight, _ = run_tiny(tmp_path, "straight", *window)
    run_tiny(tmp_path, "split", *window[:1], "trainer.total_steps=2")
    resumed, _ = run_tiny(tmp_path, "split", *window, f"trainer.resume={tmp_path / 'split'}")
    a, b = straight.model.named_trainable_tensors(), resumed.model.named_trainable_tensors()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=0, msg=name)
    decay, records = run_tiny(tmp_path, "decay", "rollout.sampling_options.sde_window_schedule=decay", "trainer.total_steps=2")
    assert [decay.family.sde_window(s)["sde_window_range"] for s in (1, 2)] == [(0, 2), (0, 1)]
    assert all(r["rollout_corr/logprob_abs_diff_max"] <= 1e-5 for r in records)


def test_geneval_prompts_and_reward_log_per_task_scores(tmp_path):
    """The shape prompt file and the geneval_shapes reward through the real loop (streamed
    scoring included): the step's per-task scores land in metrics.jsonl as reward/geneval/<task>."""
    _, records = run_tiny(tmp_path, "geneval", "trainer.total_steps=1", "trainer.prompts_per_step=4",
                          "trainer.samples_per_prompt=2", "data.prompts=null",
                          "data.prompt_file=recipes/prompts/geneval_shapes_train.jsonl",
                          "reward.rewards=[{name: geneval_shapes, reward_options: {partial_credit: true}}]")
    tasks = {k for k in records[0] if k.startswith("reward/geneval/")}
    assert tasks and tasks <= {f"reward/geneval/{t}" for t in
                               ("single_object", "two_object", "counting", "colors", "position", "color_attr")}
    assert 0 <= records[0]["reward/geneval_shapes/mean"] <= 1

"""The write-draw family (omni_rl/families/write_draw.py): a tiny Qwen3 writes, the shape demo's SD3
draws what it wrote, both trained in one trajectory through the unchanged `PPOTrainer`.

One step is on-policy on both kinds of action and moves both models (the writer by the token loss,
the image model by the step loss, each in its own optimizer group with its own lr); a frozen image
model stays bit for bit; a resumed run repeats the straight run's rewards and weights; bad configs
are one-line errors."""
import json

import pytest
import torch

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.trainer import PPOTrainer

# 2 requests x 2 samples, 3 denoising steps of which 2 trained, writer texts of at most 3 tokens; the
# images' brightness as the reward (the shape detector's scores of 4 samples are often all equal, and
# then no advantage is left to train on).
SMALL = [
    "recipe=tiny_write_draw", "reward.rewards=[{name: brightness}]", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
    "trainer.mini_batch_size=4", "trainer.micro_batch_size=2", "rollout.sampling_options.num_steps=3", "rollout.sampling_options.sde_window_size=2",
    "rollout.sampling_options.sde_window_range=[0,3]", "rollout.sampling_options.max_new_tokens=3", "trainer.val_every=0",
    "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]",
]


def trainer_for(tmp_path, name, *overrides):
    return PPOTrainer(load_config([*SMALL, f"trainer.output_dir={tmp_path / name}", *overrides]))


def weights(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def changed(before, module):
    return [n for n, p in module.named_parameters() if not torch.equal(before[n], p.detach())]


def test_one_step_is_on_policy_and_trains_both_models_each_with_its_own_lr(tmp_path):
    trainer = trainer_for(tmp_path, "run", "trainer.total_steps=1", "algo.old_logprob_mode=recompute")
    try:
        model = trainer.model
        writer, image = model.writer.trainable_module(), model.transformer
        writer_before, image_before = weights(writer), weights(image)
        groups = {g.name: g for g in model.optimizer_groups()}
        assert set(groups) == {"image", "writer"} and groups["writer"].lr == 3.0e-2
        # The writer is fully fine-tuned, the image model by LoRA only.
        assert all(p.requires_grad for p in writer.parameters())
        assert {n for n, p in image.named_parameters() if p.requires_grad} == {n for n in image_before if "lora_" in n}
        # The image model reads the writer's text (model.adapter_options.image_prompt: "{written}").
        ids = torch.tensor([[ord("h"), ord("i"), model.writer.eos_token_ids[0]]])
        assert model.image_prompts(["two blue squares"], ids, torch.ones(1, 3)) == ["hi"]
        metrics = trainer.train_step(1)
        # On-policy on both kinds of action: the writer's tokens and the image's steps (recomputed).
        assert metrics["actor/first_minibatch_ratio_max_abs_dev"] == 0.0
        assert metrics["loss/plan_ratio_max_abs_dev"] == 0.0
        assert metrics["rollout_corr/logprob_abs_diff_max"] <= 1e-5
        assert metrics["actor/writer_lr"] == 3.0e-2 and metrics["actor/image_lr"] == 1.0e-3
        assert metrics["actor/writer_grad_norm"] > 0 and metrics["actor/image_grad_norm"] > 0
        # Both models moved: the writer's weights (token loss) and the image model's LoRA (step loss).
        assert changed(writer_before, writer)
        moved = changed(image_before, image)
        assert moved and all("lora_" in n for n in moved)
    finally:
        trainer.actors.close()


def test_the_writer_alone_leaves_the_image_model_bit_for_bit(tmp_path):
    trainer = trainer_for(tmp_path, "frozen", "trainer.total_steps=1", "model.adapter_options.train_image=false")
    try:
        model = trainer.model
        assert [g.name for g in model.optimizer_groups()] == ["writer"]
        image_before, writer_before = weights(model.transformer), weights(model.writer.trainable_module())
        assert not any(p.requires_grad for p in model.transformer.parameters())
        assert trainer.actors.family.writer_chunks == 1 and not trainer.actors.family.image_trains
        metrics = trainer.train_step(1)
        assert metrics["actor/first_minibatch_ratio_max_abs_dev"] == 0.0
        assert changed(writer_before, model.writer.trainable_module())
        assert changed(image_before, model.transformer) == []
    finally:
        trainer.actors.close()


def rewards(folder):
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r["reward/total/mean"] for r in records if "reward/total/mean" in r]


def test_a_resumed_run_repeats_the_straight_runs_rewards(tmp_path):
    def run(name, *overrides):
        trainer = trainer_for(tmp_path, name, *overrides)
        trainer.fit()
        return trainer

    straight = run("straight", "trainer.total_steps=2")
    run("split", "trainer.total_steps=1", "trainer.save_every=1")
    resumed = run("split", "trainer.total_steps=2", f"trainer.resume={tmp_path / 'split'}")
    assert rewards(tmp_path / "straight") == rewards(tmp_path / "split")
    a, b = straight.model.named_trainable_tensors(), resumed.model.named_trainable_tensors()
    assert a.keys() == b.keys() and any(n.startswith("writer.") for n in a)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # The checkpoint holds both models' exports: the image's LoRA and the writer's full weights.
    export = tmp_path / "split" / "checkpoints" / "step_000001" / "lora"
    assert (export / "pytorch_lora_weights.safetensors").is_file() and (export / "writer" / "config.json").is_file()


@pytest.mark.parametrize("override, message", [
    ("trainer.backend=ray", "trainer.backend='ray': a write-draw run trains two models"),
    ("algo.kl_coef=0.1", "algo.kl_coef=0.1: expected 0 for a write-draw run"),
    ("model.adapter_options.writer.adapter=StableDiffusion3Pipeline",
     "model.adapter_options.writer.adapter='StableDiffusion3Pipeline': not a language model"),
    ("model.adapter_options.writer.adapter=Nope", "model.adapter_options.writer.adapter='Nope': unknown model adapter"),
    ("model.adapter_options.writer.lr=-1.0", "model.adapter_options.writer.lr=-1.0: expected a finite value > 0"),
    ("model.adapter_options.writer.lora.rnk=4", "model.adapter_options.writer.lora.rnk=4: "),
    ("model.adapter_options.image_prompt='{prompt}'", "model.adapter_options.image_prompt='{prompt}': expected a text with {written}"),
    ("model.adapter_options.writer.trained=false", None),  # valid: the image model trains alone
])
def test_bad_configs_are_one_line_errors(override, message, tmp_path):
    overrides = [*SMALL, f"trainer.output_dir={tmp_path}", override]
    if message is None:
        assert load_config(overrides).model.adapter_options.writer.trained is False
        return
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides, message", [
    (["model.adapter_options.train_image=false", "model.adapter_options.writer.trained=false"], "nothing trains"),
    (["model.adapter_options.writer.max_prompt_tokens=8"], "expected at most model.adapter_options.writer.max_prompt_tokens=8"),
])
def test_bad_runs_stop_at_the_command_line_in_one_line(overrides, message, tmp_path, capsys):
    code = main(["recipe=tiny_write_draw", f"trainer.output_dir={tmp_path}", *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1] and err[-1].startswith("error: ")


def test_the_plan_counts_both_models_weights_and_optimizer_states(tmp_path):
    from omni_rl.plan.weights import plan_weights

    def plan(*overrides):
        return plan_weights(load_config(["recipe=tiny_write_draw", f"trainer.output_dir={tmp_path}", *overrides]))

    joint, writer, image = plan(), plan("model.adapter_options.train_image=false"), plan("model.adapter_options.writer.trained=false")
    # Both models' weights are counted whichever trains (the image's LoRA exists only where it trains);
    # the trained ones' gradients and AdamW moments add up.
    assert joint["parameters"]["total"] == image["parameters"]["total"]
    assert joint["parameters"]["total"] == writer["parameters"]["total"] + image["parameters"]["trainable"]
    assert writer["parameters"]["trainable"] > 0 and image["parameters"]["trainable"] > 0
    assert joint["parameters"]["trainable"] == writer["parameters"]["trainable"] + image["parameters"]["trainable"]
    state = [p["per_device_bytes"]["optimizer_state"] for p in (joint, writer, image)]
    assert state[0] == state[1] + state[2] > 0

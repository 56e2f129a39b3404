"""A colocated teacher on FSDP2 ranks (`families.teachers.shard_teacher`): two Ray ranks on gloo
each hold half of its denoiser's parameters, and its velocities equal the unsharded teacher's."""
import pytest
import torch

from omni_rl.compose import load_config
from omni_rl.workers import ResourcePool, WorkerGroup
from tests.tiny_runs import TINY_SD3

RAY = ["trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2"]


@pytest.mark.long  # about a minute on 2 busy cores: two Ray ranks each build the model three times
def test_each_rank_holds_half_the_teacher_and_scores_like_the_whole_one(ray_local, tmp_path):
    base = load_config(TINY_SD3).model.path
    cfg = load_config([*TINY_SD3, *RAY, "algo.policy_loss=distill_kl", f"trainer.output_dir={tmp_path}",
                       # Another copy of the student's base: a teacher of its own (not the student's LoRA off).
                       f"algo.family_options.teachers=[{{name: copy, path: '{base}'}}]"])

    def shard_and_score(worker, cfg):  # defined here: pickled by value for the workers
        from torch.distributed.tensor import DTensor

        from omni_rl.families.teachers import Teacher, build_frozen, build_teachers
        from omni_rl.models.factory import build_model

        torch.manual_seed(0)
        student = build_model(cfg.model, worker.device, tuple(cfg.plugins))
        (teacher,) = build_teachers(cfg, student, list(cfg.algo.family_options.teachers))
        params = list(teacher.model.trainable_root().parameters())
        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)
        whole = build_frozen(cfg, cfg.model.path, None, worker.device)
        plain = Teacher(teacher.options, whole, teacher.guidance_scale, "", shares_student=False)
        shape = student.latent_shape(32, 32, 1)
        x = torch.randn((2, *shape), generator=torch.Generator().manual_seed(1))
        sigma, prompts = torch.tensor([0.9, 0.4]), ["a red circle", "two blue squares"]
        got, want = teacher.velocity(x, sigma, prompts), plain.velocity(x, sigma, prompts)
        return (teacher.sharded, all(isinstance(p, DTensor) for p in params), local,
                sum(p.numel() for p in whole.trainable_root().parameters()), (got - want).abs().max().item(),
                want.abs().max().item())

    group = WorkerGroup(ResourcePool(1, 2), "cpu", 300.0)
    try:
        results = group.run("shard a teacher", shard_and_score, [(cfg,), (cfg,)])
    finally:
        group.shutdown()
    locals_ = [r[2] for r in results]
    total = results[0][3]
    for sharded, all_dtensors, local, whole, diff, scale in results:
        assert sharded and all_dtensors and whole == total
        # Each rank holds half of every tensor's rows (one more where a dimension is odd).
        assert 0.45 * total <= local <= 0.55 * total
        # The same maths on all-gathered weights: equal within float rounding.
        assert scale > 0 and diff <= 1e-5 * max(1.0, scale)
    assert sum(locals_) == total


@pytest.mark.long  # a 2-rank Ray run: about two minutes on 2 busy cores
def test_a_sharded_teacher_keeps_the_ranks_in_step_when_they_route_differently(ray_local, tmp_path):
    # Two prompts of two sources: one rank's micro-batches hold the cats, the other's the dogs, so
    # the sharded teacher of the cats has rows on one rank only; it still runs on both (its
    # all-gathers are collectives), or the update would hang until the worker timeout.
    import json

    from omni_rl.trainer import PPOTrainer

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a red cat", "metadata": {"data_source": "cats"}}\n'
                       '{"prompt": "a blue dog", "metadata": {"data_source": "dogs"}}\n')
    base = load_config(TINY_SD3).model.path
    trainer = PPOTrainer(load_config([
        *TINY_SD3, *RAY, "algo.policy_loss=distill_kl", "trainer.total_steps=1", "trainer.val_every=0",
        f"data.prompt_file={prompts}", "data.prompts=null", "trainer.backend_options.worker_timeout_s=240",
        f"algo.family_options.teachers=[{{name: cats, path: '{base}', data_source: cats}}, {{name: others}}]",
        f"trainer.output_dir={tmp_path / 'run'}"]))
    trainer.fit()
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # Both teachers are the student's base (its LoRA starts at 0): their KLs are float rounding.
    assert 0 <= record["distill/cats/kl"] < 1e-4 and 0 <= record["distill/others/kl"] < 1e-4

"""`--plan`'s weights: the weightless build counted as the engine holds it, checked against the
same model built with its weights (local engine) and sharded by the real FSDP2 engine."""
import dataclasses
import json

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.models.factory import build_model
from omni_rl.plan.architecture import ARCHITECTURES, architecture_folder, shipped_folder
from omni_rl.plan.weights import plan_weights

RECIPE = "tiny_sd3_flowgrpo"  # LoRA on a bf16-free tiny SD3: frozen base + trainable adapters


def real_bytes(model, trainable: bool) -> int:
    params = {id(p): p for m in (model.trainable_root(), *model.frozen_modules()) for p in m.parameters()}
    return sum(p.numel() * p.element_size() for p in params.values() if p.requires_grad == trainable)


def test_local_plan_equals_the_model_built_with_weights():
    cfg = load_config([f"recipe={RECIPE}"])
    plan = plan_weights(cfg)
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    memory = plan["per_device_bytes"]
    assert memory["trainable_weights"] == real_bytes(model, True) > 0
    assert memory["frozen_weights"] == real_bytes(model, False) > 0
    assert memory["gradients"] == memory["trainable_weights"]
    assert plan["parameters"]["trainable"] == sum(p.numel() for p in model.trainable_parameters())
    assert plan["devices"]["world_size"] == 1


@pytest.fixture
def fake_group():
    def init(world_size):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fsdp2_plan_equals_the_sharded_engine(fake_group, dtype):
    """4 ranks of the real FSDP2Engine (a fake process group in this process: the sharding and
    the fp32 master copies are real, the collectives do nothing); rank 0 holds the largest shard."""
    from omni_rl.engine.fsdp2 import FSDP2Engine

    overrides = [f"recipe={RECIPE}", "trainer.backend=ray", "trainer.backend_options.devices_per_node=4", "trainer.micro_batch_size=4",
                 f"model.dtype={dtype}"]
    cfg = load_config(overrides)
    plan = plan_weights(cfg)
    assert plan["devices"]["world_size"] == 4
    fake_group(4)
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    engine = FSDP2Engine(model, cfg.optim)
    local = {"trainable": 0, "frozen": 0}
    seen = set()
    for module in (engine.module, *model.frozen_modules()):
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                t = p.to_local() if isinstance(p, torch.distributed.tensor.DTensor) else p
                local["trainable" if p.requires_grad else "frozen"] += t.numel() * t.element_size()
    memory = plan["per_device_bytes"]
    assert memory["trainable_weights"] == local["trainable"] > 0
    assert memory["frozen_weights"] == local["frozen"] > 0


def test_a_local_folder_is_planned_as_it_is(tmp_path):
    assert architecture_folder(str(tmp_path)) == tmp_path


def test_a_hub_id_maps_to_its_shipped_folder():
    assert shipped_folder("Qwen/Qwen-Image") == ARCHITECTURES / "Qwen--Qwen-Image"
    assert architecture_folder("Qwen/Qwen-Image") == ARCHITECTURES / "Qwen--Qwen-Image"
    for bad in ("Qwen-Image", "a/b/c", "/x"):
        with pytest.raises(ConfigError, match="expected a hub id"):
            shipped_folder(bad)


def test_a_hub_id_without_a_folder_is_one_line():
    with pytest.raises(ConfigError) as err:
        architecture_folder("nobody/nothing")
    assert "recipes/architectures/nobody--nothing" in str(err.value) and "\n" not in str(err.value)


def test_cli_plan_writes_plan_json(tmp_path, capsys):
    assert main([f"recipe={RECIPE}", f"trainer.output_dir={tmp_path}", "--plan"]) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["recipe"] == RECIPE and plan["parameters"]["trainable"] > 0
    out = capsys.readouterr().out
    assert "per device:" in out and "plan.json" in out


def test_cli_plan_of_a_hub_id_without_a_folder_exits_2(tmp_path, capsys):
    code = main([f"recipe={RECIPE}", "model.path=nobody/nothing", f"trainer.output_dir={tmp_path}", "--plan"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: model.path='nobody/nothing'") and err.count("\n") == 1
    assert not (tmp_path / "plan.json").exists()


# Recipes whose adapters train part of a trained module: BAGEL's generation expert alone (full
# weights), Qwen3-Omni's thinker with its towers' LoRA frozen, and the talker without its code
# predictor.
PARTIAL = [("tiny_bagel_flowgrpo", ["model.lora.enabled=false"]), ("tiny_qwen3_omni_gspo", []),
           ("tiny_qwen3_omni_talker_grpo", ["model.lora.enabled=false", "model.adapter_options.trainable=talker"])]


@pytest.mark.parametrize("recipe,extra", PARTIAL)
def test_the_trained_only_build_trains_what_training_trains(recipe, extra):
    """A shipped folder is planned through the plan spec's build of the trained networks alone:
    it must select the same parameters as the adapter's full build does for training."""
    from omni_rl.plan.weights import _build_trained_only

    cfg = load_config([f"recipe={recipe}", *extra])
    model = build_model(cfg.model, torch.device("cpu"), tuple(cfg.plugins))
    folder = architecture_folder(cfg.model.path)
    alone = _build_trained_only(cfg, dataclasses.replace(cfg.model, path=str(folder)), folder, "test").model

    def trained(m):
        return sorted((name, p.numel()) for module_name, module in m.trainable_modules().items()
                      for name, p in module.named_parameters(prefix=module_name) if p.requires_grad)

    expected = trained(model)
    assert expected and trained(alone) == expected
    assert len(expected) < sum(1 for module in model.trainable_modules().values() for _ in module.parameters())


@pytest.mark.parametrize("recipe", ["tiny_qwen3_omni_talker_grpo", "tiny_qwen3_omni_thinker_talker_grpo"])
def test_the_trained_only_build_counts_the_frozen_networks_its_spec_builds(recipe):
    """The talker stages' specs build their frozen thinker and code2wav too (`load_frozen`): the
    plan of a config-only folder then counts what the adapter's full build holds."""
    from omni_rl.plan.weights import _build_trained_only, build_weightless, weights_of

    cfg = load_config([f"recipe={recipe}"])
    folder = architecture_folder(cfg.model.path)
    full = build_weightless(cfg, folder)
    assert full.complete
    alone = _build_trained_only(cfg, dataclasses.replace(cfg.model, path=str(folder)), folder, "test")
    assert alone.frozen and alone.frozen_planned
    full_plan, alone_plan = weights_of(cfg, folder, full), weights_of(cfg, folder, alone)
    assert alone_plan["per_device_bytes"] == full_plan["per_device_bytes"]
    assert alone_plan["parameters"] == full_plan["parameters"]
    assert not any("frozen encoders" in line for line in alone_plan["not_counted"])

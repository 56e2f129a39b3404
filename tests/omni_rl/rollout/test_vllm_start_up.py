"""What the GPU backends do before vLLM serves a request, checked on a CPU without vllm.

- the spec the engine hands vLLM-Omni (`custom_pipeline_args`) survives the trip to its worker
  (JSON, msgpack) and builds the adapter with its LoRA there, under a float32 default dtype
  whatever default vLLM-Omni set, on the CPU; vLLM-Omni's `.to(device)` then moves it and the
  adapter follows;
- the config refuses what vLLM cannot start (float32 with LoRA, a LoRA rank above 512) in one
  `error:` line, and a rank vLLM does not list is rounded up;
- the `gpu` extra pins vllm-omni and the vllm it needs at one version, and a missing one of them
  is named with its install command;
- the diffusion engine shuts vLLM-Omni down on its own loop.

Where vllm-omni's package must be "installed" for a check, an empty package of that name on
`sys.path` stands in: `availability` looks for modules, and the engine's start-up is the one
method those tests replace (`_start`, which would import `AsyncOmni`).
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pytest
import torch

from omni_rl.cli import main
from omni_rl.compose import bind_blocks
from omni_rl.config.schema import LoraConfig, ModelConfig, OmniConfig
from omni_rl.models import build_model
from omni_rl.rollout.vllm_omni import availability
from omni_rl.rollout.vllm_omni.availability import BackendUnavailableError, require
from omni_rl.rollout.backends import VllmOmniOptions
from omni_rl.rollout.vllm_omni.engine import VllmOmniDiffusionEngine, engine_kwargs
from omni_rl.rollout.vllm_omni.pipelines import (
    SPEC_KEY,
    DiffusionPipelineCore,
    OmniRLDiffusionPipeline,
    OmniRLStableDiffusion3Pipeline,
    default_dtype,
)
from omni_rl.rollout.vllm_omni.text_engine import VLLM_LORA_RANKS, vllm_max_lora_rank

REPO_ROOT = Path(__file__).resolve().parents[3]
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def sd3_config(path, **model) -> OmniConfig:
    cfg = OmniConfig()
    cfg.model = ModelConfig(path=str(path), lora=LoraConfig(rank=4), **model)
    cfg.rollout.backend = "vllm_omni"
    return bind_blocks(cfg)


def through_the_wire(args: dict, codec: str) -> dict:
    """`custom_pipeline_args` as vLLM-Omni's worker receives them (plain data again)."""
    if codec == "json":
        return json.loads(json.dumps(args))
    return msgpack.unpackb(msgpack.packb(args), raw=False)


# --- 1.1: the spec round trip ---------------------------------------------------------------
@pytest.mark.parametrize("codec", ["json", "msgpack"])
def test_the_spec_round_trip_builds_the_adapter_with_its_lora(tiny_sd3_path, codec):
    cfg = sd3_config(tiny_sd3_path)
    args = through_the_wire(engine_kwargs(cfg, str(tiny_sd3_path), VllmOmniOptions())["custom_pipeline_args"], codec)
    core = DiffusionPipelineCore.from_spec(args[SPEC_KEY], torch.device("cpu"))
    assert isinstance(core.model.cfg.lora, LoraConfig) and core.model.cfg.lora.rank == 4
    torch.manual_seed(cfg.trainer.seed)
    trainer = build_model(cfg.model, torch.device("cpu"))
    served, trained = core.model.named_trainable_tensors(), trainer.named_trainable_tensors()
    assert sorted(served) == sorted(trained) and any(".lora_A." in name for name in served)
    for name, value in trained.items():  # seeded as the trainer is: the same initial LoRA
        assert torch.equal(served[name], value), name


def test_a_bad_key_in_the_spec_is_named(tiny_sd3_path):
    spec = engine_kwargs(sd3_config(tiny_sd3_path), str(tiny_sd3_path), VllmOmniOptions())["custom_pipeline_args"][SPEC_KEY]
    spec["model"]["lora"]["rnk"] = 4
    with pytest.raises(Exception, match="rnk"):
        DiffusionPipelineCore.from_spec(spec, torch.device("cpu"))


# --- 1.5: a float32 default while the adapter is built ----------------------------------------
def test_the_core_is_built_as_the_trainer_builds_whatever_the_default_dtype(tiny_sd3_path):
    cfg = sd3_config(tiny_sd3_path, dtype="bfloat16")
    spec = engine_kwargs(cfg, str(tiny_sd3_path), VllmOmniOptions())["custom_pipeline_args"][SPEC_KEY]
    with default_dtype(torch.bfloat16):  # what vLLM-Omni's set_default_torch_dtype(od_config.dtype) does
        core = DiffusionPipelineCore.from_spec(spec, torch.device("cpu"))
        assert torch.get_default_dtype() == torch.bfloat16  # put back after the build
    torch.manual_seed(cfg.trainer.seed)
    trainer = build_model(cfg.model, torch.device("cpu"))

    def dtypes(model):
        modules = {**model.trainable_modules(), **{f"frozen_{i}": m for i, m in enumerate(model.frozen_modules())}}
        return {f"{k}.{n}": t.dtype for k, m in modules.items() for n, t in [*m.named_parameters(), *m.named_buffers()]}

    assert dtypes(core.model) == dtypes(trainer)
    assert core.model.sigmas(6, 32, 32, 1).dtype == trainer.sigmas(6, 32, 32, 1).dtype


def test_the_adapter_sees_a_float32_default_while_it_is_built(tiny_sd3_path, monkeypatch):
    """The tiny adapters give every tensor a dtype of their own, so the comparison above holds
    either way for them; what a real adapter or a library makes without one depends on the
    default it is built under, which must be the trainer's."""
    from adapters.sd3 import StableDiffusion3Adapter

    seen, setup = [], StableDiffusion3Adapter.setup_trainable

    def recording(self):
        seen.append(torch.get_default_dtype())
        setup(self)

    monkeypatch.setattr(StableDiffusion3Adapter, "setup_trainable", recording)
    spec = engine_kwargs(sd3_config(tiny_sd3_path, dtype="bfloat16"), str(tiny_sd3_path), VllmOmniOptions())["custom_pipeline_args"][SPEC_KEY]
    with default_dtype(torch.bfloat16):
        DiffusionPipelineCore.from_spec(spec, torch.device("cpu"))
    assert seen == [torch.float32]


# --- 1.6: loaded as vLLM-Omni loads a custom pipeline -------------------------------------------
def test_the_pipeline_is_built_on_the_cpu_and_follows_vllm_omnis_move(tiny_sd3_path):
    cfg = sd3_config(tiny_sd3_path)
    args = through_the_wire(engine_kwargs(cfg, str(tiny_sd3_path), VllmOmniOptions())["custom_pipeline_args"], "json")
    pipeline = OmniRLStableDiffusion3Pipeline(od_config=SimpleNamespace(custom_pipeline_args=args))
    assert pipeline.core.model.device == torch.device("cpu")
    assert {p.device.type for p in pipeline.parameters()} == {"cpu"}
    # vLLM-Omni then calls model.to(target_device) (DiffusersPipelineLoader._init_from_load_format);
    # the meta device stands in for the GPU here.
    assert pipeline.to(torch.device("meta")) is pipeline
    assert pipeline.core.model.device == torch.device("meta")
    assert {p.device.type for p in pipeline.parameters()} == {"meta"}


# --- 1.8: rollout.backend_options.enforce_eager does nothing for the diffusion pipelines ------------------
def test_vllm_omni_finds_nothing_to_compile_in_our_pipelines():
    """vLLM-Omni compiles `setup_compile()` or the `_dit_modules` / `transformer` / `transformer_2`
    attributes (DiffusionModelRunner.load_model); docs/rollout.md says ours have none."""
    for name in ("setup_compile", "_dit_modules", "transformer", "transformer_2"):
        assert not hasattr(OmniRLDiffusionPipeline, name), name


# --- 1.2 / 1.3: what vLLM cannot start fails at load --------------------------------------------
def test_float32_with_lora_on_vllm_is_one_error_line(capsys):
    code = main(["--cfg", "recipe=tiny_qwen3_grpo", "rollout.backend=vllm", "model.lora.enabled=true"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: model.dtype='float32' with model.lora.enabled=true"), err[0]
    assert main(["--cfg", "recipe=tiny_qwen3_grpo", "rollout.backend=vllm", "model.lora.enabled=true",
                 "model.dtype=bfloat16"]) == 0
    assert main(["--cfg", "recipe=tiny_qwen3_grpo", "rollout.backend=vllm"]) == 0  # full weights: float32 is fine


def test_a_lora_rank_vllm_does_not_list_is_rounded_up():
    assert vllm_max_lora_rank(4) == 8
    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 300, 320, 321, 512)] == [1, 8, 8, 16, 320, 320, 512, 512]
    assert all(vllm_max_lora_rank(r) == r for r in VLLM_LORA_RANKS)
    with pytest.raises(ValueError, match="model.lora.rank=513: expected at most 512"):
        vllm_max_lora_rank(513)


def test_a_lora_rank_above_vllms_largest_is_refused_at_load(capsys):
    code = main(["--cfg", "recipe=tiny_qwen3_grpo", "rollout.backend=vllm", "model.lora.enabled=true",
                 "model.dtype=bfloat16", "model.lora.rank=1024"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: model.lora.rank=1024: expected at most 512"), err


# --- 1.4: the gpu extra and the package check --------------------------------------------------
def test_the_gpu_extra_pins_vllm_omni_and_its_vllm_at_one_version():
    import tomllib

    extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    pins = dict(re.fullmatch(r"([a-z-]+)==([0-9.]+)", spec).groups() for spec in extra)
    assert set(pins) == {"vllm", "vllm-omni"}, extra
    assert pins["vllm"].split(".")[:2] == pins["vllm-omni"].split(".")[:2], pins
    assert pins["vllm"] == availability.VLLM_VERSION  # the version the missing-package error names
    dockerfile = (REPO_ROOT / "docker" / "Dockerfile.cuda").read_text()
    assert f"ARG VLLM_VERSION={pins['vllm']}" in dockerfile and f"ARG VLLM_OMNI_VERSION={pins['vllm-omni']}" in dockerfile


def fake_package(root: Path, name: str) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here")
def test_vllm_omni_without_vllm_is_one_line_naming_the_install_command(tmp_path, monkeypatch):
    fake_package(tmp_path, "vllm_omni")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert availability.missing_packages("vllm_omni") == ["vllm"]
    with pytest.raises(BackendUnavailableError) as err:
        require("vllm_omni")
    message = str(err.value)
    assert "\n" not in message
    assert "needs the 'vllm' package" in message and "'vllm-omni'" not in message
    assert f"pip install vllm=={availability.VLLM_VERSION}`" in message


# --- 1.7: the diffusion engine's shutdown runs on its loop --------------------------------------
class _OmniOnALoop:
    """Stands in for AsyncOmni: records where shutdown() ran (AsyncOmni cancels a task there)."""

    def __init__(self):
        self.shutdown_loop = None

    def shutdown(self):
        self.shutdown_loop = asyncio.get_running_loop()


class _EngineWithoutVllmOmni(VllmOmniDiffusionEngine):
    async def _start(self, kwargs):
        return _OmniOnALoop()


def test_the_diffusion_engine_shuts_vllm_omni_down_on_its_loop(tmp_path, monkeypatch, make_sd3):
    for name in ("vllm", "vllm_omni"):
        if importlib.util.find_spec(name) is None:
            fake_package(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = OmniConfig()
    cfg.rollout.backend = "vllm_omni"
    engine = _EngineWithoutVllmOmni(cfg, make_sd3(), "unused", VllmOmniOptions())
    omni, loop = engine._omni, engine._loop
    engine.close()
    assert omni.shutdown_loop is loop
    assert not engine._thread.is_alive() and threading.current_thread() is not engine._thread
    engine.close()  # a second close does nothing

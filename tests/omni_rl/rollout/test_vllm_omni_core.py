"""The GPU backends' CPU-side parts, without vllm: registry errors, the server path's choice of
engine, and the vLLM-Omni pipeline core (a batch of prompts -> one result per request).

The core is run for real on the tiny SD3, fed the very prompt dicts and sampling-param fields
the engine sends (`codec.py`); vLLM-Omni's own `OmniDiffusionSamplingParams` is not importable
here, so a namespace with its fields stands in for it (the core reads attributes only). It must
give bit for bit what `NativeDiffusionEngine` gives for the same requests admitted together.
"""
from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.compose import bind_blocks, check_components
from omni_rl.errors import ConfigError
from omni_rl.rollout.backends import build_rollout_engine
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.server.serve import build_server
from omni_rl.rollout.text_types import TextRequest
from omni_rl.rollout.types import DiffusionRequest
from omni_rl.rollout.vllm_omni.availability import BackendUnavailableError
from omni_rl.rollout.vllm_omni.codec import request_to_prompt, result_from_output, sampling_fields
from omni_rl.rollout.vllm_omni.pipelines import DiffusionPipelineCore, pipeline_class_for
from omni_rl.rollout.vllm_omni.text_engine import check_text_request, peft_lora_files, result_from_completion

HAS_VLLM_OMNI = importlib.util.find_spec("vllm_omni") is not None
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def request(seed, **overrides) -> DiffusionRequest:
    fields = dict(prompt=f"prompt {seed % 3}", seed=seed, height=32, width=32, num_steps=6, guidance_scale=4.5,
                  kernel="sde", noise_level=0.7, sde_window_size=2, sde_window_range=(0, 4))
    fields.update(overrides)
    return DiffusionRequest(**fields)


def as_vllm_omni_batch(requests):
    """What `DiffusionRequestBatch.prompts` / `.sampling_params_list` hold for these requests."""
    return [request_to_prompt(r) for r in requests], [SimpleNamespace(**sampling_fields(r)) for r in requests]


def assert_same_result(a, b):
    assert a.request_id == b.request_id and a.window == b.window and a.kernel == b.kernel
    for name in ("latents", "log_probs", "sigmas", "sigmas_next", "noise_levels", "final_latent", "image"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name


# --- the pipeline core ---------------------------------------------------------------------
def test_core_gives_the_native_engines_bits_for_the_same_requests(make_sd3):
    model = make_sd3()
    # Two batch keys (two kernels) and different windows, noises and seeds.
    reqs = [request(s) for s in range(5)] + [request(9, kernel="cps", sde_window_size=0, sde_window_range=None)]
    engine = NativeDiffusionEngine(model, max_num_seqs=len(reqs), max_wait_ms=5000)
    try:
        native = engine.generate(reqs, timeout_s=120)
    finally:
        engine.close()
    core = DiffusionPipelineCore(model, max_num_seqs=len(reqs))
    envelopes = core.run(*as_vllm_omni_batch(reqs))
    assert len(envelopes) == len(reqs)  # one output per request: the core splits the batch itself
    for want, envelope in zip(native, envelopes):
        assert_same_result(result_from_output(envelope), want)
    assert {r.window for r in native} != {(0, 6)}  # the windows really differ from "all steps"


def test_core_honours_max_num_seqs_and_keeps_request_order(make_sd3):
    model = make_sd3()
    reqs = [request(s) for s in range(5)]
    small = DiffusionPipelineCore(model, max_num_seqs=2).sample(*as_vllm_omni_batch(reqs))
    assert [r.request_id for r in small] == [r.request_id for r in reqs]
    engine = NativeDiffusionEngine(model, max_num_seqs=2, max_wait_ms=5000)
    try:
        engine_results = engine.generate(reqs, timeout_s=120)
    finally:
        engine.close()
    # Batches of two either way; the last request runs alone in both.
    for a, b in zip(small, engine_results):
        torch.testing.assert_close(a.final_latent, b.final_latent, rtol=0, atol=1e-5)


def test_a_prompt_without_our_payload_is_sampled_as_an_ode_request(make_sd3):
    """vLLM-Omni's warm-up run sends a plain prompt with its own sampling params."""
    core = DiffusionPipelineCore(make_sd3(), max_num_seqs=4)
    sampling = SimpleNamespace(height=32, width=32, num_frames=1, num_inference_steps=2, guidance_scale=0.0, seed=None)
    (result,) = core.sample(["dummy prompt"], [sampling])
    assert result.kernel == "ode" and result.log_probs.numel() == 2 and result.image.shape[-1] == 3


def test_weight_updates_change_the_next_batch_and_refuse_a_wrong_kind(make_sd3):
    trainer, served = make_sd3(), make_sd3()
    core = DiffusionPipelineCore(served, max_num_seqs=4)
    batch = as_vllm_omni_batch([request(1)])
    before = core.sample(*batch)[0].final_latent
    with torch.no_grad():
        for p in trainer.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    tensors = trainer.named_trainable_tensors()
    with pytest.raises(ValueError, match="model.lora.enabled"):
        core.load_trainer_tensors(tensors, "full")
    assert core.load_trainer_tensors(tensors, "lora") == len(tensors)
    assert not torch.equal(core.sample(*batch)[0].final_latent, before)


def test_pipeline_classes_cover_the_three_families_and_name_the_rest():
    assert pipeline_class_for("StableDiffusion3Pipeline").endswith("OmniRLStableDiffusion3Pipeline")
    assert pipeline_class_for("WanPipeline").endswith("OmniRLWanPipeline")
    assert pipeline_class_for("QwenImagePipeline").endswith("OmniRLQwenImagePipeline")
    with pytest.raises(ValueError, match="LTX2Pipeline.*QwenImagePipeline, StableDiffusion3Pipeline, WanPipeline"):
        pipeline_class_for("LTX2Pipeline")


# --- the registry and the server path -------------------------------------------------------
@pytest.mark.skipif(HAS_VLLM_OMNI, reason="vllm-omni is installed here")
def test_vllm_omni_without_the_package_is_one_clear_error(make_sd3):
    cfg = OmniConfig()
    cfg.rollout.backend = "vllm_omni"
    bind_blocks(cfg)
    with pytest.raises(BackendUnavailableError) as err:
        build_rollout_engine(cfg, make_sd3())
    message = str(err.value)
    assert "rollout.backend='vllm_omni'" in message and "'vllm-omni'" in message and "rollout.backend_options.python" in message


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here")
def test_vllm_without_the_package_is_one_clear_error():
    from omni_rl.config.schema import ModelConfig
    from omni_rl.models import build_model

    cfg = OmniConfig()
    cfg.rollout.backend = "vllm"
    bind_blocks(cfg)
    model = build_model(ModelConfig(adapter="Qwen3ForCausalLM", path="tiny:qwen3"), torch.device("cpu"))
    with pytest.raises(BackendUnavailableError, match=r"rollout.backend='vllm' needs the 'vllm' package"):
        build_rollout_engine(cfg, model)


def test_a_backend_of_the_wrong_family_names_the_right_one(make_sd3):
    cfg = OmniConfig()
    cfg.rollout.backend = "vllm"
    bind_blocks(cfg)
    with pytest.raises(TypeError, match="rollout.backend='vllm' has no engine.*use rollout.backend=vllm_omni"):
        build_rollout_engine(cfg, make_sd3())


@pytest.mark.skipif(HAS_VLLM_OMNI, reason="vllm-omni is installed here")
def test_the_server_builds_the_engine_in_process_with_a_weightless_model(tiny_sd3_path):
    """Inside the server (run by rollout.backend_options.python) the vllm_omni factory must build the engine
    there, not start another server: it reaches the package check, with a meta-device model."""
    cfg = OmniConfig()
    cfg.model.path = str(tiny_sd3_path)
    cfg.rollout.backend, cfg.rollout.backend_options = "vllm_omni", {"python": "/some/other/python"}
    with pytest.raises(BackendUnavailableError, match="vllm_omni"):
        build_server(cfg, "vllm_omni")


def test_config_rules_of_the_vllm_keys():
    cfg = OmniConfig()
    cfg.model.adapter, cfg.algo.policy_loss = "Qwen3ForCausalLM", "ppo_clip"  # top_p is a text model's option
    cfg.rollout.backend, cfg.rollout.sampling_options = "vllm", {"top_p": 0.9}
    with pytest.raises(ConfigError, match=r"rollout.sampling_options.top_p=0.9: expected 1.0 with rollout.backend=vllm"):
        check_components(cfg)
    cfg = OmniConfig()
    cfg.rollout.backend, cfg.rollout.backend_options = "vllm_omni", {"gpu_memory_utilization": 1.5}
    with pytest.raises(ConfigError, match="rollout.backend_options.gpu_memory_utilization=1.5"):
        check_components(cfg)


# --- the text engine's conversions ----------------------------------------------------------
def test_peft_files_from_our_lora_tensors():
    a, b = torch.zeros(4, 8), torch.zeros(8, 4)
    state, config = peft_lora_files(
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight": a,
         "model.layers.0.self_attn.q_proj.lora_B.default.weight": b}, rank=4, alpha=8.0, targets=["q_proj"],
        prefix="thinker.")
    assert sorted(state) == ["base_model.model.thinker.model.layers.0.self_attn.q_proj.lora_A.weight",
                             "base_model.model.thinker.model.layers.0.self_attn.q_proj.lora_B.weight"]
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["target_modules"] == ["q_proj"]
    with pytest.raises(ValueError, match="not a LoRA A/B tensor"):
        peft_lora_files({"model.norm.weight": a}, 4, 8.0, ["q_proj"])


def test_a_completion_becomes_a_text_result():
    from omni_rl.models.autoregressive import PromptInputs

    req = TextRequest(prompt=PromptInputs(input_ids=torch.tensor([1, 2])), seed=0, max_new_tokens=4, temperature=0.7)
    # vLLM's logprobs: one dict per sampled token, token id -> Logprob (its .logprob).
    steps = [{5: SimpleNamespace(logprob=-0.5)}, {7: SimpleNamespace(logprob=-1.25), 3: SimpleNamespace(logprob=-2.0)}]
    result = result_from_completion(req, [5, 7], steps, "stop", "ab", weight_version=3)
    assert result.response_ids.tolist() == [5, 7] and result.log_probs.tolist() == [-0.5, -1.25]
    assert result.finish_reason == "stop" and result.weight_version == 3 and result.temperature == 0.7
    with pytest.raises(ValueError, match="2 tokens but 1 log-prob"):
        result_from_completion(req, [5, 7], steps[:1], "length", "ab", 0)
    with pytest.raises(ValueError, match="top_p=0.9"):
        check_text_request(TextRequest(prompt=req.prompt, seed=0, max_new_tokens=4, top_p=0.9))

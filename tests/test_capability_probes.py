"""No `getattr` / `hasattr` probes of what a registered component can do (issue 39, item 1).

What a component can do is a declared field of its registry entry or its base class
(`OmniModelBase.makes_audio`, `RewardDeclaration.endpoint`, `Sink.media`, `OneKindScorer.accepts`),
never an attribute looked up by name with a fallback. This scans omni_rl/, adapters/ and rewards/
for `getattr(obj, "name", ...)` and `hasattr(obj, "name")` with a literal name and fails on any
(file, name) not listed below with the reason it is no such probe. A computed name (a loop over a
dataclass's own fields, `module:attr` from a command line) reads a declared field and is not listed.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("omni_rl", "adapters", "rewards")

# Third-party objects whose attributes differ between versions or model classes.
_TRANSFORMERS = "a transformers/diffusers object: its attributes differ between versions and model classes"
_VLLM = "a vLLM object: its attributes differ between vLLM versions and model classes"
_TENSOR = "a value that may be a tensor, a numpy array or a PIL image (duck typing of data, not of a component)"
_OS = "a platform feature (os, torch.npu) that not every system has"

ALLOWED: dict[tuple[str, str], str] = {
    ("omni_rl/config/loader.py", "full_key"): "an omegaconf exception: only some carry the key",
    ("omni_rl/config/options.py", "__name__"): "a typing annotation: generics have no __name__",
    ("omni_rl/device.py", "npu"): _OS,
    ("omni_rl/logging/console.py", "exec_module"): "an importlib loader: not every loader executes modules",
    ("omni_rl/logging/gallery.py", "detach"): _TENSOR,
    ("omni_rl/logging/video.py", "detach"): _TENSOR,
    ("omni_rl/logging/sinks.py", "numel"): _TENSOR,
    ("omni_rl/logging/sinks.py", "size"): _TENSOR,
    ("omni_rl/logging/sinks.py", "item"): _TENSOR,
    ("omni_rl/logging/sinks.py", "shape"): _TENSOR,
    ("omni_rl/logging/sinks.py", "dtype"): _TENSOR,
    ("omni_rl/models/autoregressive.py", "config"): _TRANSFORMERS,
    ("omni_rl/models/autoregressive.py", "get_text_config"): _TRANSFORMERS,
    ("omni_rl/models/autoregressive.py", "max_position_embeddings"): _TRANSFORMERS,
    ("omni_rl/models/autoregressive.py", "model_max_length"): _TRANSFORMERS,
    ("omni_rl/models/autoregressive.py", "cache"): _TRANSFORMERS,
    ("omni_rl/models/autoregressive.py", "activation_checkpointing_enable"): _TRANSFORMERS,
    ("omni_rl/models/autoregressive.py", "get_base_model"): "a PEFT-wrapped or a bare transformers model",
    ("omni_rl/models/autoregressive.py", "model"): _TRANSFORMERS,
    ("omni_rl/models/autoregressive.py", "layers"): _TRANSFORMERS,
    ("omni_rl/models/autoregressive.py", "self_attn"): _TRANSFORMERS,
    ("omni_rl/models/loading.py", "__file__"): "a module: namespace and built-in modules have no file",
    ("omni_rl/models/pretrained.py", "load_config"): _TRANSFORMERS,
    ("omni_rl/models/pretrained.py", "from_config"): _TRANSFORMERS,
    ("omni_rl/plan/text_steps.py", "__dict__"): "walks any object a traced forward returns",
    ("omni_rl/plan/roofline.py", "config"): _TRANSFORMERS,
    ("omni_rl/plan/roofline.py", "text_config"): _TRANSFORMERS,
    ("omni_rl/plan/roofline.py", "num_experts"): _TRANSFORMERS,
    ("omni_rl/plan/roofline.py", "num_experts_per_tok"): _TRANSFORMERS,
    ("omni_rl/plan/trace.py", "logits"): _TRANSFORMERS,
    ("omni_rl/plan/trace.py", "sample"): _TRANSFORMERS,
    ("omni_rl/registry.py", "__module__"): "names whatever was registered, in a duplicate-name message",
    ("omni_rl/registry.py", "__qualname__"): "names whatever was registered, in a duplicate-name message",
    ("omni_rl/reward/registry.py", "add_note"): "exceptions have add_note from Python 3.11",
    ("omni_rl/reward/server/app.py", "__qualname__"): "names a served callable (function or instance) in /health",
    ("omni_rl/rollout/diffusion_sampling.py", "request_id"): "a request of the wrong type, named in its own error",
    ("omni_rl/rollout/server/app.py", "request_id"): "a request of the wrong type, named in its own error",
    ("omni_rl/rollout/vllm_omni/codec.py", "num_inference_steps"): _VLLM,
    ("omni_rl/rollout/vllm_omni/codec.py", "seed"): _VLLM,
    ("omni_rl/rollout/vllm_omni/codec.py", "height"): _VLLM,
    ("omni_rl/rollout/vllm_omni/codec.py", "width"): _VLLM,
    ("omni_rl/rollout/vllm_omni/codec.py", "num_frames"): _VLLM,
    ("omni_rl/rollout/vllm_omni/codec.py", "guidance_scale"): _VLLM,
    ("omni_rl/rollout/vllm_omni/codec.py", "multimodal_output"): _VLLM,
    ("omni_rl/rollout/vllm_omni/pipelines.py", "custom_pipeline_args"): _VLLM,
    ("omni_rl/rollout/vllm_omni/text_engine.py", "logprob"): _VLLM,
    ("omni_rl/rollout/vllm_omni/vllm_worker.py", "config"): _VLLM,
    ("omni_rl/rollout/vllm_omni/vllm_worker.py", "lm_head"): _VLLM,
    ("omni_rl/rollout/vllm_omni/vllm_worker.py", "model"): _VLLM,
    ("omni_rl/rollout/vllm_omni/vllm_worker.py", "get_input_embeddings"): _VLLM,
    ("omni_rl/rollout/vllm_omni/vllm_worker.py", "embed_tokens"): _VLLM,
    ("omni_rl/rollout/vllm_omni/vllm_worker.py", "tie_word_embeddings"): _VLLM,
    ("omni_rl/rollout/vllm_omni/vllm_worker.py", "quant_method"): _VLLM,
    ("omni_rl/rollout/vllm_omni/vllm_worker.py", "process_weights_after_loading"): _VLLM,
    ("omni_rl/utils/token_files.py", "getuid"): _OS,
    ("omni_rl/utils/token_files.py", "O_NOFOLLOW"): _OS,
    ("adapters/bagel/adapter.py", "lora_A"): "a PEFT layer's adapters, present once LoRA is added",
    ("adapters/bagel/checkpoint.py", "pos_embed"): "a torch module of the checkpoint: only some hold position tables",
    ("adapters/bagel/edit.py", "connector"): "a BAGEL network without vit_config.json is built without the connector",
    ("adapters/bagel/network.py", "connector"): "a BAGEL network without vit_config.json is built without the connector",
    ("adapters/bagel/vision.py", "vision_model"): _TRANSFORMERS,
    ("adapters/flux2.py", "text_config"): _TRANSFORMERS,
    ("adapters/ltx2.py", "padding_side"): _TRANSFORMERS,
    ("adapters/qwen3.py", "keys"): "transformers >= 5 returns a BatchEncoding, older ones a list",
    ("adapters/qwen3_omni.py", "chat_template"): _TRANSFORMERS,
    ("adapters/qwen3_omni.py", "activation_checkpointing_enable"): _TRANSFORMERS,
    ("adapters/qwen3_omni.py", "convert"): "a user's media item, checked to be a PIL image",
    ("adapters/qwen3_omni.py", "size"): "a user's media item, checked to be a PIL image",
    ("adapters/qwen3_omni.py", "get_base_model"): "a PEFT-wrapped or a bare transformers model",
    ("adapters/qwen3_omni_talker.py", "enable_audio_output"): _TRANSFORMERS,
    ("adapters/qwen3_omni_talker.py", "talker_config"): _TRANSFORMERS,
    ("adapters/plan/qwen3_omni_talker.py", "spatial_merge_size"): _TRANSFORMERS,
    ("adapters/tiny/decoders.py", "time_conv"): _TRANSFORMERS,
    ("adapters/tiny/decoders.py", "post_quant_conv"): _TRANSFORMERS,
    ("adapters/tiny/minimax_h3.py", "weight_g"): _TRANSFORMERS,
    ("adapters/tiny/minimax_h3.py", "weight_v"): _TRANSFORMERS,
    ("rewards/latent_http.py", "dtype"): _TENSOR,
    ("rewards/latent_scorers.py", "dtype"): _TENSOR,
    ("rewards/latent_scorers.py", "shape"): _TENSOR,
    ("rewards/pretrained.py", "dtype"): _TRANSFORMERS,
}

# Probes of a registered component's options still looked up by name (issue 39, item 1): none
# left, as a registry entry's `options_class` and an options dataclass's `check()` are declared.
KNOWN_PROBES: dict[tuple[str, str], str] = {}


def literal_probes(source: str, filename: str = "<source>") -> list[tuple[str, int]]:
    """(attribute name, line) of every getattr/hasattr in `source` whose name is a literal."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            found.append((node.args[1].value, node.lineno))
    return found


def probes() -> dict[tuple[str, str], list[int]]:
    """(file, attribute name) -> lines, over omni_rl/, adapters/ and rewards/."""
    found: dict[tuple[str, str], list[int]] = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            for name, line in literal_probes(path.read_text(encoding="utf-8"), str(path)):
                found.setdefault((path.relative_to(ROOT).as_posix(), name), []).append(line)
    return found


def test_no_getattr_probe_of_a_component_capability():
    unlisted = {key: lines for key, lines in probes().items() if key not in ALLOWED and key not in KNOWN_PROBES}
    assert not unlisted, (
        "getattr/hasattr with a literal name outside the allow-list: "
        + "; ".join(f"{path}:{lines[0]} {name!r}" for (path, name), lines in sorted(unlisted.items()))
        + ". Declare what a component can do as a field of its registry entry or base class; if this "
          "is no such probe (a third-party object, a platform feature), add it to ALLOWED with the reason"
    )


def test_the_scan_finds_the_probes_the_old_code_had():
    # The old spellings are found, with their lines; a computed name (a loop over declared fields) is not.
    source = (
        "def f(model, sink, options):\n"
        "    audio = getattr(model, 'makes_audio', False)\n"
        "    if hasattr(sink, 'add_image'):\n"
        "        pass\n"
        "    return [getattr(options, name) for name in ('a', 'b')]\n"
    )
    assert literal_probes(source) == [("makes_audio", 2), ("add_image", 3)]

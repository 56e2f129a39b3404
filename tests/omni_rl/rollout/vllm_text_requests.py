"""What both `vllm` text-backend test files (`test_vllm_cpu.py` on vLLM's CPU build,
`test_vllm_text.py` on a GPU) sample and score: chat requests at one temperature, and the
trainer's log-probs of a sampled response."""
from __future__ import annotations

import torch

from omni_rl.rollout.text_types import TextRequest

TEMPERATURE = 0.7


def requests(model, n: int) -> list[TextRequest]:
    prompts = [model.encode_prompt([{"role": "user", "content": f"count to {i}"}]) for i in range(n)]
    return [TextRequest(prompt=p, seed=i, max_new_tokens=16, temperature=TEMPERATURE) for i, p in enumerate(prompts)]


@torch.no_grad()
def trainer_log_probs(model, result) -> torch.Tensor:
    """The trainer's log-probs of `result`'s response tokens at TEMPERATURE, on the host."""
    seq = torch.cat([result.prompt.input_ids, result.response_ids])[None].to(model.device)
    lp = model.token_log_probs(seq, torch.ones_like(seq), len(result.prompt.input_ids), TEMPERATURE)
    return lp[0, : len(result.response_ids)].float().cpu()

"""`latent_http`: score clean latents on a remote latent scorer (DiNa-LRM style, no VAE decode).

    RewardSpec("latent_http", kwargs={"url": "http://127.0.0.1:8000", "timeout_s": 60})

The batch is the protocol's float32 `latents` tensor `[B, ...]`: `samples` itself when it is a
float tensor, else every `metadata[i]["latent"]` stacked (a sample without one raises, never
scores 0). It shares `http_scorer`'s `RemoteScorer` (`omni_rl.reward.http_client`) and so its
options (`url`, `timeout_s`, `retries`, `backoff_s`, `token_file`, `allow_insecure_remote`,
`max_reply_bytes`) and its failure, `RewardServerError` after the retries;
`python -m omni_rl.reward.server --scorer latent_stats` serves one.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from omni_rl.reward import RewardInputError, check_batch, register_reward
from omni_rl.reward.inputs import check_prompts_metadata
from omni_rl.reward.http_client import (
    MAX_REPLY_BYTES,
    RemoteScorer,
    ScoreClient,
    check_client_files,
    check_client_options,
    client_endpoint,
)
from omni_rl.reward.protocol import LATENTS

LATENT_KEY = "latent"


def collect_latents(samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> torch.Tensor:
    """The batch's clean latents as one float32 CPU tensor [B, ...] (rules in the module docstring)."""
    if isinstance(samples, np.ndarray) and np.issubdtype(samples.dtype, np.floating):
        samples = torch.from_numpy(samples)
    if isinstance(samples, torch.Tensor) and samples.is_floating_point():
        if samples.ndim < 2 or samples.shape[0] == 0:
            raise RewardInputError(
                f"latent_http: samples are a float tensor of shape {tuple(samples.shape)}; expected "
                f"clean latents [B, ...] with B >= 1 and at least one dim per sample"
            )
        check_prompts_metadata(int(samples.shape[0]), prompts, metadata, "latents", "latent_http")
        return samples.detach().to("cpu", torch.float32).contiguous()

    n = check_batch(samples, prompts, metadata)
    missing = [i for i, meta in enumerate(metadata) if LATENT_KEY not in meta]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise RewardInputError(
            f"latent_http needs each sample's clean latent: metadata[i][{LATENT_KEY!r}] is missing for "
            f"sample(s) {shown} of {n}. Put the final denoised latent of every sample there, or call "
            f"the scorer with the latents themselves as a float tensor [B, ...]"
        )
    latents = []
    for i, meta in enumerate(metadata):
        value = meta[LATENT_KEY]
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise RewardInputError(
                f"latent_http: metadata[{i}][{LATENT_KEY!r}] is a {type(value).__name__} "
                f"{getattr(value, 'dtype', '')}; expected a float tensor (the sample's clean latent)"
            )
        latents.append(value.detach().to("cpu", torch.float32))
    shapes = sorted({tuple(t.shape) for t in latents})
    if len(shapes) > 1:
        raise RewardInputError(
            f"latent_http: the metadata latents have different shapes {shapes}; one batch must share "
            f"one latent shape (score different resolutions in separate batches)"
        )
    return torch.stack(latents).contiguous()


@register_reward("latent_http", check_options=check_client_options, check_files=check_client_files,
                 endpoint=client_endpoint)
def latent_http(
    *, url: str, timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5, token_file: str | None = None,
    allow_insecure_remote: bool = False, max_reply_bytes: int = MAX_REPLY_BYTES,
) -> RemoteScorer:
    """Clean latents -> a remote latent scorer at `url` (see the module docstring)."""
    client = ScoreClient(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s, token_file=token_file,
                         allow_insecure_remote=allow_insecure_remote, max_reply_bytes=max_reply_bytes)
    return RemoteScorer("latent_http", client, LATENTS, collect_latents)

"""`http_scorer`: score images (or video frames) on a remote scorer over HTTP.

    RewardSpec("http_scorer", kwargs={"url": "https://10.0.0.5:8443", "timeout_s": 60})

For a reward model in another process or on another machine. The batch goes as the protocol's
uint8 `images` tensor (RGB `[B, H, W, 3]`, or video frames `[B, T, H, W, C]` as they are), the
prompts as they are, and the metadata as JSON (PIL images as PNG data URIs). Options: `url`
(required), `timeout_s` (one whole attempt, 60), `retries` (3, on connection errors, timeouts,
408, 429, 5xx), `backoff_s` (0.5, doubled, jittered), `token_file` (else `OMNI_RL_REWARD_TOKEN`,
sent only to `OMNI_RL_REWARD_TOKEN_URL`), `allow_insecure_remote` (plain http:// outside
loopback refused unless set), `max_reply_bytes` (16 MiB). After the retries it raises
`RewardServerError` naming the URL, the cause and the attempts.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from omni_rl.reward import RewardInputError, check_batch, register_reward, to_uint8_numpy
from omni_rl.reward.http_client import (
    MAX_REPLY_BYTES,
    RemoteScorer,
    ScoreClient,
    check_client_files,
    check_client_options,
    client_endpoint,
)
from omni_rl.reward.protocol import IMAGES


def images_for_wire(samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> torch.Tensor:
    """Check the batch and return it as a contiguous uint8 CPU tensor [B, H, W, 3] or [B, T, H, W, C]."""
    if isinstance(samples, (torch.Tensor, np.ndarray)) and samples.ndim == 5:
        video = torch.from_numpy(samples) if isinstance(samples, np.ndarray) else samples
        if video.dtype != torch.uint8:
            raise RewardInputError(
                f"http_scorer: video has dtype {video.dtype}; expected uint8 [B, T, H, W, C] with values "
                f"0..255 (convert with (video.clamp(0, 1) * 255).round().to(torch.uint8))"
            )
        check_batch(video[:, 0], prompts, metadata)  # the first frames carry the same B and layout checks
        return video.detach().to("cpu").contiguous()
    check_batch(samples, prompts, metadata)
    return torch.from_numpy(np.ascontiguousarray(to_uint8_numpy(samples)))


@register_reward("http_scorer", check_options=check_client_options, check_files=check_client_files,
                 endpoint=client_endpoint)
def http_scorer(
    *, url: str, timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5, token_file: str | None = None,
    allow_insecure_remote: bool = False, max_reply_bytes: int = MAX_REPLY_BYTES,
) -> RemoteScorer:
    """uint8 images/video -> a remote scorer at `url` (see the module docstring)."""
    client = ScoreClient(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s, token_file=token_file,
                         allow_insecure_remote=allow_insecure_remote, max_reply_bytes=max_reply_bytes)
    return RemoteScorer("http_scorer", client, IMAGES, images_for_wire)

"""`http_scorer`: score images (or video frames) on a remote scorer over HTTP.

    RewardSpec("http_scorer", kwargs={"url": "https://10.0.0.5:8443", "timeout_s": 60,
                                      "retries": 3, "backoff_s": 0.5})

For a reward model that lives in another process or on another machine (a big VLM judge, a
model with conflicting dependencies). The batch is sent as the protocol's uint8 `images`
tensor (`omni_rl.reward.protocol`):

- images as every reward receives them (a list of PIL images or uint8 [B, H, W, C], see
  `omni_rl.reward.inputs`) are sent as RGB uint8 [B, H, W, 3] (grey expanded, alpha refused);
- a uint8 tensor [B, T, H, W, C] (video frames, channels last) is sent as it is.
Prompts are sent as they are; metadata is sent as JSON with its tensor/array values left out
and PIL images (an edit's `source_image`) as PNG data URIs (`protocol.metadata_for_wire`).

Options: `url` (required; the server's base URL), `timeout_s` (the deadline of one whole
attempt: connect, send, read the reply; default 60), `retries` (extra attempts on connection
errors, timeouts, 408, 429 and 5xx, default 3), `backoff_s` (first backoff sleep, doubled per
retry, with jitter, default 0.5), `token_file` (the server's token file, mode 0600, naming its
URL: the server's `--token-file`), `allow_insecure_remote` (default false: a plain http:// URL
outside loopback is refused at load), `max_reply_bytes` (the largest answer read, default 16 MiB).
Without `token_file` the token is `OMNI_RL_REWARD_TOKEN`'s, sent only when
`OMNI_RL_REWARD_TOKEN_URL` names this server (`omni_rl.reward.http_client`; a secret stays out
of the recipe, which is saved with the run).
The scorer is the `RemoteScorer` that `http_scorer` and `latent_http` share
(`omni_rl.reward.http_client`); this module supplies its batch check.
After the retries the call raises `RewardServerError` naming the URL, the status/cause and the
attempts; a `RewardManager` turns it into a `RewardError` naming the reward. A call that
fails takes at most about `(1 + retries) * timeout_s` plus the backoff sleeps.
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

"""`vlm_edit_judge`: how well an image edit follows its instruction, judged by a VLM served elsewhere.

    RewardSpec("vlm_edit_judge", kwargs={"url": "https://10.0.0.5:8443", "batch_size": 8})

The judge runs behind the remote-scorer protocol (docs/reward_protocol.md); this reward is its
client (`http_scorer`'s `ScoreClient`, retries included) and sends the edited images, the
instructions and each sample's metadata with `source_image` as a PNG data URI. A sample without
a source image raises before any request (the reward needs an edit dataset). On the server,
`edit_cases(images, prompts, metadata)` gives `EditCase(source, edited, instruction, metadata)`s,
so a judge is a few lines; `--scorer reward:edit_brightness` serves a rule-based one for demos.
Options: as `http_scorer`'s, with `batch_size` (8: each sample carries its source image) and
`timeout_s` (120: a VLM is slow).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image

from omni_rl.reward import check_batch, register_reward, to_pil_list, to_uint8_numpy
from omni_rl.reward.http_client import MAX_REPLY_BYTES, ScoreClient, check_client_files, check_client_options
from omni_rl.reward.protocol import IMAGES, metadata_for_wire
from rewards.edit_inputs import check_source_image, source_images

NAME = "vlm_edit_judge"


@dataclass
class EditCase:
    """One edit as a judge sees it: the source and edited RGB PIL images, the instruction, and the
    rest of the sample's metadata (JSON values; `source_image` still in it as its data URI)."""

    source: Image.Image
    edited: Image.Image
    instruction: str
    metadata: dict[str, Any]


def edit_cases(images: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[EditCase]:
    """The server side: a request's (images, prompts, metadata) -> one `EditCase` per sample.
    Raises `RewardInputError` (the server's 400) for a sample without a source image."""
    check_batch(images, prompts, metadata)
    sources = source_images(metadata, NAME)
    return [EditCase(s, e, p, dict(m)) for s, e, p, m in zip(sources, to_pil_list(images), prompts, metadata)]


class VlmEditJudge:
    """Sends edits, instructions and source images to a remote judge, `batch_size` samples a request."""

    def __init__(self, client: ScoreClient, batch_size: int):
        self.client = client
        self.batch_size = batch_size

    def __call__(self, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        n = check_batch(samples, prompts, metadata)
        source_images(metadata, NAME)  # refuse a batch without sources before anything is sent
        edits = torch.from_numpy(np.ascontiguousarray(to_uint8_numpy(samples)))
        wire = metadata_for_wire(metadata)  # a group's shared source is encoded once
        scores: list[float] = []
        for start in range(0, n, self.batch_size):
            end = min(n, start + self.batch_size)
            scores += self.client.score(edits[start:end], list(prompts[start:end]), wire[start:end], kind=IMAGES)
        return scores

    @property
    def url(self) -> str:
        """The endpoint scored against (named in the reward manager's timeout messages)."""
        return self.client.score_url

    def __repr__(self) -> str:
        return f"VlmEditJudge({self.client!r}, batch_size={self.batch_size})"


def _check_options(*, url: str, batch_size: int = 8, timeout_s: float = 120.0, retries: int = 3,
                   backoff_s: float = 0.5, token_file: str | None = None, allow_insecure_remote: bool = False,
                   max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
    check_client_options(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s, token_file=token_file,
                         allow_insecure_remote=allow_insecure_remote, max_reply_bytes=max_reply_bytes)
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}; expected an int >= 1 (samples per request)")


@register_reward(NAME, modalities={"image"}, check_options=_check_options, check_files=check_client_files,
                 check_item=check_source_image)
def vlm_edit_judge(*, url: str, batch_size: int = 8, timeout_s: float = 120.0, retries: int = 3,
                   backoff_s: float = 0.5, token_file: str | None = None, allow_insecure_remote: bool = False,
                   max_reply_bytes: int = MAX_REPLY_BYTES) -> VlmEditJudge:
    """Edits + instructions + source images -> a remote judge at `url` (see the module docstring)."""
    _check_options(url=url, batch_size=batch_size, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                   token_file=token_file, allow_insecure_remote=allow_insecure_remote, max_reply_bytes=max_reply_bytes)
    client = ScoreClient(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s, token_file=token_file,
                         allow_insecure_remote=allow_insecure_remote, max_reply_bytes=max_reply_bytes)
    return VlmEditJudge(client, int(batch_size))

"""`vlm_edit_judge`: how well an image edit follows its instruction, judged by a VLM served elsewhere.

    RewardSpec("vlm_edit_judge", kwargs={"url": "https://10.0.0.5:8443", "batch_size": 8})

The judge (a large VLM, on its own GPUs and with its own dependencies) runs behind the
remote-scorer protocol (`docs/reward_protocol.md`); this reward is its client, the same
`ScoreClient` as `http_scorer` with the same retries. Each request carries, for its samples,

- the `images` tensor: the edited images, RGB uint8 [B, H, W, 3];
- `prompts`: the edit instructions (an edit item's prompt is its instruction);
- `metadata`: each sample's metadata as JSON (`protocol.metadata_for_wire`), in which
  `source_image` (and `reference_image` when the row has one) is a PNG data URI, and
  `target_text` / `source_text` are there when the row gives them. Tensors (the clean
  `latent`) are left out.

A sample without `metadata["source_image"]` raises before any request is sent, saying the reward
needs an edit dataset (`omni_rl.data.edit_prompts`): a judge that never sees the source cannot
tell an edit from a new picture.

The judge answers one finite score per sample, higher is better (its scale is the judge's: e.g.
a 0..10 rating, or the probability of "yes" to "does the edit follow the instruction?").
On the server side `edit_cases(images, prompts, metadata)` turns a request back into
`EditCase(source, edited, instruction, metadata)`s with PIL images, so a judge is a few lines:

    def make_judge(model_path):               # python -m omni_rl.reward.server \\
        vlm = load_my_vlm(model_path)         #   --scorer my_pkg.judge:make_judge --kwargs '{...}'
        def score(images, prompts, metadata):
            return [vlm.rate(c.source, c.edited, c.instruction) for c in edit_cases(images, prompts, metadata)]
        return score

For a demo without a VLM, `python -m omni_rl.reward.server --scorer reward:edit_brightness`
serves the rule-based `edit_brightness` (it reads the source from the data URI) as the judge.

Options: `url` (required; the server's base URL), `batch_size` (samples per request, default 8:
every sample carries its source image as ~1.4x its PNG size of JSON, and safetensors takes at
most 100 MB of header), `timeout_s` (the deadline of one whole attempt, default 120: a VLM is
slow), `retries` (extra attempts on connection errors, timeouts, 408, 429 and 5xx, default 3),
`backoff_s` (first backoff sleep, doubled per retry, with jitter, default 0.5), `token_file`,
`allow_insecure_remote` and `max_reply_bytes` (as `http_scorer`'s: the token goes only to the
server it is for, and plain http:// outside loopback is refused unless allowed). A failure after
the retries raises `RewardServerError` naming the URL, the status or cause and the attempts.
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

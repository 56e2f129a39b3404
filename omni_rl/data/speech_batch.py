"""`SpeechBatch`: a step's spoken answers, as the trainer loop and the talker family pass them.

N samples, each the thinker's answer (a whole `TextBatch`) and F speech frames; the trajectory is
the frames, or `[N, R + F]` (answer tokens first) when the thinker trains too:

  codes        [N, F, K] long  each frame's K codec tokens (first codebook, then the residual ones)
  frame_mask   [N, F] float    1 on the sampled frames (the end-of-speech frame included)
  speech_rollout_log_probs [N, F] fp32  the frames' log-probs at sampling time
  audio        N mono float32 waveforms [S_i] at `sample_rate` Hz (what the rewards hear)
  speech_finish_reasons  "stop" (end-of-speech token) or "length" (cut at max_frames)
  prefix_width the talker prefix's padded width in the step (every micro-batch replays it)
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import torch

from omni_rl.data.text_batch import TextBatch


@dataclass
class SpeechBatch:
    text: TextBatch
    codes: torch.Tensor
    frame_mask: torch.Tensor
    speech_rollout_log_probs: torch.Tensor
    speech_temperature: float
    audio: list[torch.Tensor]
    sample_rate: int
    speech_finish_reasons: list[str]
    trains_thinker: bool
    prefix_width: int = 0
    rewards: Optional[torch.Tensor] = None
    advantages: Optional[torch.Tensor] = None
    old_log_probs: Optional[torch.Tensor] = None
    old_means: Optional[torch.Tensor] = None
    rollout_is_weights: Optional[torch.Tensor] = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.text)
        if self.codes.dim() != 3 or self.codes.shape[0] != n or self.frame_mask.shape != self.codes.shape[:2] \
                or self.speech_rollout_log_probs.shape != self.frame_mask.shape or len(self.audio) != n:
            raise ValueError(f"a speech batch of {n} answers needs codes [N, F, K], frame_mask and log-probs [N, F] and "
                             f"N waveforms; got {tuple(self.codes.shape)}, {tuple(self.frame_mask.shape)}, "
                             f"{tuple(self.speech_rollout_log_probs.shape)} and {len(self.audio)} waveforms")

    def __len__(self) -> int:
        return len(self.text)

    @property
    def answer_width(self) -> int:
        """R: the answer's columns of the trajectory (0 when the thinker does not train)."""
        return self.text.response_mask.shape[1] if self.trains_thinker else 0

    @property
    def rollout_log_probs(self) -> torch.Tensor:
        if not self.trains_thinker:
            return self.speech_rollout_log_probs
        return torch.cat([self.text.rollout_log_probs, self.speech_rollout_log_probs], dim=1)

    def action_mask(self) -> torch.Tensor:
        if not self.trains_thinker:
            return self.frame_mask
        return torch.cat([self.text.response_mask, self.frame_mask], dim=1)

    @property
    def group_index(self) -> torch.Tensor:
        return self.text.group_index

    @property
    def weight_versions(self) -> Optional[torch.Tensor]:
        return self.text.weight_versions

    @property
    def metadata(self) -> list[dict[str, Any]]:
        return self.text.metadata

    @property
    def prompts(self) -> list[str]:
        return self.text.prompts

    def prompt_ids(self) -> list[torch.Tensor]:
        return prompt_ids_of(self.text)

    def answer_ids(self) -> list[torch.Tensor]:
        return answer_ids_of(self.text)

    def select(self, index: Sequence[int] | torch.Tensor) -> "SpeechBatch":
        idx = torch.as_tensor(index, dtype=torch.long)
        ids = idx.tolist()
        pick = lambda t: None if t is None else t.index_select(0, idx.to(t.device))  # noqa: E731
        return replace(
            self, text=self.text.select(idx), codes=pick(self.codes), frame_mask=pick(self.frame_mask),
            speech_rollout_log_probs=pick(self.speech_rollout_log_probs), audio=[self.audio[i] for i in ids],
            speech_finish_reasons=[self.speech_finish_reasons[i] for i in ids], rewards=pick(self.rewards),
            advantages=pick(self.advantages), old_log_probs=pick(self.old_log_probs), old_means=None,
            rollout_is_weights=pick(self.rollout_is_weights),
        )


def prompt_ids_of(text: TextBatch) -> list[torch.Tensor]:
    """Each sample's prompt tokens (its left padding removed)."""
    width = text.prompt_width
    return [row[:width][mask[:width].bool()] for row, mask in zip(text.sequences, text.attention_mask)]


def answer_ids_of(text: TextBatch) -> list[torch.Tensor]:
    """Each sample's answer tokens (the sampled ones)."""
    width = text.prompt_width
    return [row[width:][mask.bool()] for row, mask in zip(text.sequences, text.response_mask)]

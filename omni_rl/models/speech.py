"""`SpeechModelBase`: the contract of omni models that answer in text, then speak the answer.

A sample is the thinker's answer tokens, then F speech frames; a frame is K codec tokens and one
action whose log-prob is the sum of its tokens' `log_softmax(logits / temperature)` in fp32.
Subclasses give `sample_speech`, `speech_log_probs` (teacher forced), `decode_speech` and
`trains_thinker`.
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from omni_rl.models.autoregressive import AutoregressiveModelBase


@dataclass
class SpeechSample:
    """Sampled speech of B answers, frames right-padded to F = max_frames.

    codes:      [B, F, K] long   each frame's K codec tokens (0 on padding and after an end frame's first)
    frame_mask: [B, F] float     1 on every sampled frame, the end-of-speech frame included
    log_probs:  [B, F] fp32      the frames' log-probs at sampling time (0 where the mask is 0)
    finish_reasons: "stop" (the end-of-speech token) or "length" (cut at max_frames), per row
    prefix_width: the columns of the talker's padded prefix in this batch; `speech_log_probs`
                  pads to at least as many, so that every micro-batch of the step replays the
                  same shapes (as a text batch keeps its step's width) and a frame's log-prob does
                  not depend on its batch-mates
    """

    codes: torch.Tensor
    frame_mask: torch.Tensor
    log_probs: torch.Tensor
    finish_reasons: list[str]
    prefix_width: int = 0


class SpeechModelBase(AutoregressiveModelBase):
    family: ClassVar[str] = "talker"
    makes_audio: ClassVar[bool] = True
    trains_thinker: ClassVar[bool] = False
    # The talker family puts the answer each sample was asked to speak in its metadata, for the
    # rewards that compare with it (asr_wer, speech_rate; checked at load against this).
    sample_metadata_keys: ClassVar[frozenset[str]] = frozenset({"spoken_text"})

    @property
    @abstractmethod
    def sample_rate(self) -> int:
        """Hz of `decode_speech`'s waveforms."""

    @abstractmethod
    def sample_speech(self, prompts: list[torch.Tensor], answers: list[torch.Tensor], seeds: list[int],
                      max_frames: int, temperature: float) -> SpeechSample:
        """Speak each answer, one utterance per pair from its own seed (temperature 0: greedy)."""

    @abstractmethod
    def speech_log_probs(self, prompts: list[torch.Tensor], answers: list[torch.Tensor], codes: torch.Tensor,
                         frame_mask: torch.Tensor, temperature: float, prefix_width: int | None = None) -> torch.Tensor:
        """[B, F] fp32 log-probs of the given frames (teacher forced)."""

    @abstractmethod
    def decode_speech(self, codes: torch.Tensor, frame_mask: torch.Tensor) -> list[torch.Tensor]:
        """B mono waveforms [S_i] (float32, on the CPU)."""

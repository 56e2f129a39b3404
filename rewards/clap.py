"""CLAP reward: cosine similarity of CLAP's audio and prompt embeddings (LAION-CLAP through
transformers' `ClapModel`).

    clap = cos(text_embedding(prompt), audio_embedding(resample(audio, 48 kHz)))      in [-1, 1]

Audio comes as a `MediaSamples` or mono clips at their rates (`rewards.audio_inputs`), resampled
to the processor's rate. A clip longer than the extractor's 10 s window is cut to its first
window, and a fused checkpoint's random `is_longer` flag is set to the truth, so the reward is a
function of the sample (the extractor would otherwise crop or fuse at random). Prompts are padded
to 77 tokens, so a score does not depend on its batch. Options: `model`
(`laion/clap-htsat-unfused`), `processor`, `sample_rate`, `device`.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from omni_rl.device import pick_device
from omni_rl.reward import register_reward
from omni_rl.utils.audio import resample
from rewards.audio_inputs import audio_clips, check_sample_rate
from rewards.pretrained import device_network, load_pretrained

DEFAULT_MODEL = "laion/clap-htsat-unfused"


class ClapScorer:
    def __init__(self, model: str, processor: str | None, sample_rate: int | None, device: str):
        from transformers import ClapModel, ClapProcessor

        check_sample_rate("clap", sample_rate)
        self.sample_rate = sample_rate
        self.device = pick_device(device)
        self.model = load_pretrained(ClapModel, model, "model", "clap").to(self.device).eval()
        self.processor = load_pretrained(ClapProcessor, processor or model, "processor", "clap")
        self.rate = int(self.processor.feature_extractor.sampling_rate)
        self.window = int(self.processor.feature_extractor.nb_max_samples)

    @torch.no_grad()
    def audio_embeddings(self, clips: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
        waves = [resample(clip, rate, self.rate)[: self.window].numpy() for clip, rate in clips]
        features = self.processor.feature_extractor(waves, sampling_rate=self.rate, return_tensors="pt")
        is_longer = torch.zeros(len(waves), 1, dtype=torch.bool)
        pooled = self.model.audio_model(
            input_features=features["input_features"].to(self.device, torch.float32),
            is_longer=is_longer.to(self.device),
        ).pooler_output
        return torch.nn.functional.normalize(self.model.audio_projection(pooled).float(), dim=-1)

    @torch.no_grad()
    def text_embeddings(self, prompts: Sequence[str]) -> torch.Tensor:
        tokens = self.processor.tokenizer(
            list(prompts), padding="max_length", truncation=True, max_length=77, return_tensors="pt",
        )
        pooled = self.model.text_model(
            input_ids=tokens["input_ids"].to(self.device), attention_mask=tokens["attention_mask"].to(self.device),
        ).pooler_output
        return torch.nn.functional.normalize(self.model.text_projection(pooled).float(), dim=-1)

    def __call__(self, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        clips = audio_clips("clap", samples, prompts, metadata, self.sample_rate)
        return (self.audio_embeddings(clips) * self.text_embeddings(prompts)).sum(dim=-1).cpu().tolist()


@register_reward("clap", modalities={"audio"}, device_networks=device_network("ClapModel", "model", DEFAULT_MODEL, "clap"))
def clap(
    *, model: str = DEFAULT_MODEL, processor: str | None = None, sample_rate: int | None = None, device: str = "auto",
) -> ClapScorer:
    """CLAP cosine similarity in [-1, 1] of each audio clip with its prompt."""
    return ClapScorer(model, processor, sample_rate, device)

"""CLAP reward: cosine similarity of CLAP's audio and prompt embeddings (LAION-CLAP through
transformers' `ClapModel`).

    clap = cos(text_embedding(prompt), audio_embedding(resample(audio, 48 kHz)))      in [-1, 1]

Audio input (`samples`): a `MediaSamples` with audio (scored at its `sample_rate`, channels
averaged), or one mono float clip per prompt as a tensor [B, L] or a list of 1-D clips, at
`metadata[i]["sample_rate"]` or the option `sample_rate`; the contract, shared with the
ImageBind reward, is `rewards.audio_inputs`. The reward declares modality audio.

Each clip is resampled to the processor's rate (48 kHz for LAION-CLAP) with
`omni_rl.utils.audio.resample` (windowed sinc, its default method), then handed to
`ClapProcessor`'s feature extractor (log-mel, 10 s windows, short clips repeated then
zero-padded: "repeatpad"). A clip longer than the window is cut to its *first* window here,
because the extractor would otherwise crop it at a random place (`rand_trunc`) or fuse random
chunks (`fusion`) and the reward would not be a function of the sample. For fused
checkpoints the extractor's random `is_longer` flag is also replaced by the truth (no clip is
longer after the cut), for the same reason.

Options:
    model        a transformers `ClapModel` (default `laion/clap-htsat-unfused`; also e.g.
                 `laion/larger_clap_general`); hub id, local folder, or `tiny:clap-reward`.
    processor    where to load the `ClapProcessor` from (default: `model`).
    sample_rate  the rate of clips whose metadata has no `sample_rate` (default None: required
                 in the metadata).
    device       `auto` or a device name (see `omni_rl.device.pick_device`).

Prompts are padded to 77 tokens (and truncated there, as LAION-CLAP was trained) so a prompt's
embedding does not depend on its batch; the whole batch runs through each tower at once, fp32,
eval mode, no gradients.
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

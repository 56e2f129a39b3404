"""`SAMPLERS`: how the evaluation job draws a benchmark's samples, one sampler per model family.

A sampler declares the protocol `fields` it reads (others are refused), `recipe_values(cfg)` for
the fields a benchmark leaves open, and `makes(protocol)` (what its samples are). Its
`draw(rows, out)` makes each sample from `protocol.sample_seed(row, k)`, writes its file and
returns a `Drawn`: `diffusion` (ODE images or videos), `autoregressive` (responses), `talker`
(spoken answers).

Not here: which samples are drawn (the job), scoring, records (`store`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

import torch

from omni_rl.eval.protocol import Protocol
from omni_rl.eval.store import sample_path
from omni_rl.registry import Registry

# (row of the prompt file, sample index, its prompt item)
Row = tuple[int, int, Any]


@dataclass
class Drawn:
    """One chunk's samples, in the order of the rows given.

    samples:  what the scorers score: uint8 images [N, H, W, C], a `MediaSamples` (video and/or
              audio), or N response texts
    prompts:  per sample, the prompt text the scorers get
    metadata: per sample, the metadata the scorers get (the row's, plus what sampling adds)
    seeds:    per sample, the request's seed
    keep:     per sample, what its record stores beside the scores: "file" (relative to the
              evaluation folder) of the image, video or WAV written, "poster", "text", ...
    """

    samples: Any
    prompts: list[str]
    metadata: list[dict]
    seeds: list[int]
    keep: list[dict[str, Any]]


class Sampler(ABC):
    fields: ClassVar[tuple[str, ...]]

    @classmethod
    @abstractmethod
    def recipe_values(cls, cfg) -> dict[str, Any]:
        """The recipe's value of each field of `fields` (read before any model loads)."""

    @classmethod
    @abstractmethod
    def makes(cls, protocol: Protocol) -> frozenset[str]:
        """What the samples drawn under the (filled) `protocol` are."""

    def __init__(self, cfg, model, protocol: Protocol):
        from omni_rl.families.base import build_family
        from omni_rl.rollout.backends import ROLLOUT_BACKENDS

        self.cfg, self.model, self.protocol = cfg, model, protocol
        self.family = build_family(cfg, model, trains=False)
        # The job samples in its own process: the native engine of the model's kind.
        self.engine = ROLLOUT_BACKENDS.get("native").build(cfg, model)

    @abstractmethod
    def draw(self, rows: Sequence[Row], out: Path) -> Drawn:
        """Generate rows' samples, write their files under `out`, and return them."""

    def close(self) -> None:
        self.engine.close()


SAMPLERS: Registry[type[Sampler]] = Registry("evaluation sampler")


def _relative(path: Path, out: Path) -> str:
    return str(path.relative_to(out))


@SAMPLERS.register("diffusion")
class DiffusionSampler(Sampler):
    fields = ("num_steps", "guidance_scale", "height", "width", "num_frames", "fps")

    @classmethod
    def recipe_values(cls, cfg) -> dict[str, Any]:
        r = cfg.rollout.sampling_options
        # Frames and fps belong to a video model's protocol only; an image result names neither.
        video = dict(num_frames=r.num_frames, fps=r.fps) if r.num_frames > 1 else {}
        return dict(num_steps=r.num_steps, guidance_scale=r.guidance_scale, height=r.height, width=r.width, **video)

    @classmethod
    def makes(cls, protocol: Protocol) -> frozenset[str]:
        # Whether a video model also makes sound is the adapter's; a video may carry it.
        return frozenset({"video", "audio"}) if (protocol.num_frames or 1) > 1 else frozenset({"image"})

    def draw(self, rows: Sequence[Row], out: Path) -> Drawn:
        from PIL import Image

        from omni_rl.logging.video import save_video
        from omni_rl.utils.atomic import atomic_save_image

        p = self.protocol
        video = {k: getattr(p, k) for k in ("num_frames", "fps") if getattr(p, k) is not None}
        requests = [self.family.request(
            item, p.sample_seed(row, k), num_steps=p.num_steps, guidance_scale=p.guidance_scale, height=p.height,
            width=p.width, kernel="ode", noise_level=0.0, sde_window_size=0, sde_window_range=None, **video)
            for row, k, item in rows]
        results = self.engine.generate(requests, timeout_s=self.cfg.rollout.timeout_s)
        images = torch.stack([res.image for res in results])
        audio = torch.stack([res.audio for res in results]) if results[0].audio is not None else None
        samples = self.family.reward_samples(images, results[0].fps, audio, results[0].sample_rate)
        keep = []
        for n, (row, k, _item) in enumerate(rows):
            png = sample_path(out, row, k)
            if images.ndim == 4:
                atomic_save_image(Image.fromarray(images[n].numpy()), png)
                keep.append({"file": _relative(png, out)})
                continue
            mp4 = save_video(images[n], sample_path(out, row, k, ".mp4"), results[n].fps,
                             audio=None if audio is None else audio[n].clamp(-1, 1), sample_rate=results[n].sample_rate)
            atomic_save_image(Image.fromarray(images[n, 0].numpy()), png)
            keep.append({"file": _relative(mp4, out), "poster": _relative(png, out)})
        return Drawn(samples, [item.prompt for _, _, item in rows], [dict(item.metadata) for _, _, item in rows],
                     [req.seed for req in requests], keep)


@SAMPLERS.register("autoregressive")
class TextSampler(Sampler):
    fields = ("temperature", "top_p", "max_new_tokens")

    @classmethod
    def recipe_values(cls, cfg) -> dict[str, Any]:
        o = cfg.rollout.sampling_options
        return dict(temperature=o.temperature, top_p=o.top_p, max_new_tokens=o.max_new_tokens)

    @classmethod
    def makes(cls, protocol: Protocol) -> frozenset[str]:
        return frozenset({"text"})

    def text_family(self):
        """The family whose requests write the answer."""
        return self.family

    def answer_request(self, item, seed: int):
        p = self.protocol
        return self.text_family().request(item, seed, temperature=p.temperature, top_p=p.top_p,
                                          max_new_tokens=p.max_new_tokens)

    def draw(self, rows: Sequence[Row], out: Path) -> Drawn:
        requests = [self.answer_request(item, self.protocol.sample_seed(row, k)) for row, k, item in rows]
        results = self.engine.generate(requests, timeout_s=self.cfg.rollout.timeout_s)
        texts = [res.text for res in results]
        keep = [{"text": res.text, "tokens": len(res.response_ids), "finish_reason": res.finish_reason}
                for res in results]
        return Drawn(texts, [item.prompt for _, _, item in rows], [dict(item.metadata) for _, _, item in rows],
                     [req.seed for req in requests], keep)


@SAMPLERS.register("talker")
class SpeechSampler(TextSampler):
    fields = TextSampler.fields + ("speech_temperature", "max_frames")

    @classmethod
    def recipe_values(cls, cfg) -> dict[str, Any]:
        o = cfg.rollout.sampling_options
        return dict(TextSampler.recipe_values(cfg), speech_temperature=o.speech_temperature, max_frames=o.max_frames)

    @classmethod
    def makes(cls, protocol: Protocol) -> frozenset[str]:
        return frozenset({"audio"})

    def text_family(self):
        return self.family.answer  # the talker's answer is written by the text family it composes

    def draw(self, rows: Sequence[Row], out: Path) -> Drawn:
        from omni_rl.reward.media import MediaSamples
        from omni_rl.utils.atomic import atomic_write_bytes
        from omni_rl.utils.audio import wav_bytes

        requests = [self.answer_request(item, self.protocol.sample_seed(row, k)) for row, k, item in rows]
        batch = self.family.answer_and_speak(
            self.engine, requests, [item.prompt for _, _, item in rows], [dict(item.metadata) for _, _, item in rows],
            list(range(len(rows))), self.protocol.speech_temperature, self.protocol.max_frames)
        keep = []
        for n, (row, k, _item) in enumerate(rows):
            wav = atomic_write_bytes(sample_path(out, row, k, ".wav"), wav_bytes(batch.audio[n], batch.sample_rate))
            keep.append({"file": _relative(wav, out), "spoken_text": batch.text.texts[n],
                         "frames": int(batch.frame_mask[n].sum())})
        samples = MediaSamples(audio=list(batch.audio), sample_rate=batch.sample_rate)
        return Drawn(samples, list(batch.prompts), list(batch.metadata), [req.seed for req in requests], keep)

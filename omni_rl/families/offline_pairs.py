"""Offline Diffusion-DPO: each training step's preference pairs, read from a file instead of sampled.

With `trainer.pipeline=offline_pairs` step s trains `trainer.prompts_per_step` pairs of
`data.preference_file` (epochs reshuffled by the seed, so resume repeats the run), encoded
through the VAE into the `PairBatch` that online `diffusion_dpo` trains. Latents are not cached:
the encode is small beside the DPO forwards.
"""
from __future__ import annotations

import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.data.preference_file import (
    PreferenceFileError, PreferenceRow, load_preference_file, preference_prompts, read_pair_images,
)
from omni_rl.data.prompts import PromptItem, PromptSampler
from omni_rl.families.base import prompt_limits
from omni_rl.families.preference_pairs import PairBatch
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.utils.seeding import derive_seed


class OfflinePairs:
    def __init__(self, cfg: OmniConfig, model: DiffusionModelBase):
        if not isinstance(model, DiffusionModelBase) or type(model).encode_images is DiffusionModelBase.encode_images:
            raise PreferenceFileError(
                f"data.preference_file={cfg.data.preference_file!r}: model.adapter={cfg.model.adapter} cannot encode "
                f"images into latents (no encode_images), so it cannot train on given pairs; use an adapter that "
                f"can (StableDiffusion3Pipeline) or online pairs (no data.preference_file)"
            )
        self.cfg, self.model = cfg, model
        self.rows = load_preference_file(cfg.data.preference_file, cfg.data.allow_paths_outside,
                                         prompt_limits(cfg).max_prompt_tokens)
        t = cfg.trainer
        self.sampler = PromptSampler(self.rows, t.prompts_per_step, t.seed, cfg.data.shuffle)

    def prompt_items(self) -> list[PromptItem]:
        """The file's distinct prompts: the run's training prompts (and validation's by default)."""
        return preference_prompts(self.rows)

    def rows_for_step(self, step: int) -> list[PreferenceRow]:
        """The pairs training step `step` (1-based) trains."""
        return self.sampler.prompts_for_step(step - 1)

    def batch(self, step: int) -> PairBatch:
        r = self.cfg.rollout.sampling_options
        rows = self.rows_for_step(step)
        pairs = [read_pair_images(row, r.height, r.width) for row in rows]
        seeds = torch.tensor([derive_seed(self.cfg.trainer.seed, "offline-pair", step, k) for k in range(len(rows))],
                             dtype=torch.long)
        return PairBatch.from_images(
            self.model, [row.prompt for row in rows], torch.stack([c for c, _ in pairs]),
            torch.stack([rej for _, rej in pairs]), seeds, r.guidance_scale, r.negative_prompt,
        )

"""The diffusion family's side of the trainer: requests, batches, reward inputs, validation.

`PPOTrainer` runs the same loop for every family; a stage turns a step's prompts into a batch
with the family's rollout engine, says what the rewards score (decoded images), scores the
behaviour policy, and renders validation samples (a PNG grid).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.data.diffusion_batch import DiffusionBatch
from omni_rl.data.prompts import PromptItem
from omni_rl.logging import make_grid
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.types import DiffusionRequest
from omni_rl.trainer.diffusion_actor import DiffusionActor
from omni_rl.trainer.scored_rollout import scored_rollout
from omni_rl.utils.atomic import atomic_save_image
from omni_rl.utils.seeding import derive_seed


class DiffusionStage:
    def __init__(self, cfg: OmniConfig, model: DiffusionModelBase):
        self.cfg = cfg
        self.model = model
        self.engine = NativeDiffusionEngine(model, cfg.rollout.max_num_seqs, cfg.rollout.max_wait_ms)
        self.actor = DiffusionActor(model, cfg.algo)

    def _request(self, item: PromptItem, seed: int, **changes) -> DiffusionRequest:
        r = self.cfg.rollout
        fields = dict(
            prompt=item.prompt, seed=seed, height=r.height, width=r.width, num_steps=r.num_steps,
            guidance_scale=r.guidance_scale, kernel=r.kernel, noise_level=r.noise_level,
            sde_window_size=r.sde_window_size,
            sde_window_range=tuple(r.sde_window_range) if r.sde_window_range else None,
            negative_prompt=r.negative_prompt,
        )
        fields.update(changes)
        return DiffusionRequest(**fields)

    def rollout(self, prompts: list[PromptItem], step: int, score=None) -> tuple[DiffusionBatch, list]:
        """The step's batch; with `score(sample, prompt, metadata, future)` each sample is handed
        to the reward scorer the moment it is finished (the returned futures carry its rewards)."""
        cfg, n, r = self.cfg, self.cfg.trainer.samples_per_prompt, self.cfg.rollout
        requests, metadata, groups = [], [], []
        for g, item in enumerate(prompts):
            shared_noise = None
            if r.same_noise_in_group:
                gen = torch.Generator().manual_seed(derive_seed(cfg.trainer.seed, "group-noise", step, g))
                shared_noise = torch.randn(self.model.latent_shape(r.height, r.width), generator=gen)
            for k in range(n):
                seed = derive_seed(cfg.trainer.seed, "train", step, g * n + k)
                requests.append(self._request(item, seed, initial_noise=shared_noise))
                metadata.append(item.metadata)
                groups.append(g)
        results, reward_futures = scored_rollout(
            self.engine, requests, [req.prompt for req in requests], metadata, score, self._reward_input, r.timeout_s
        )
        return DiffusionBatch.from_results(results, metadata, groups), reward_futures

    def _reward_input(self, result, prompt: str, metadata: dict) -> tuple:
        return result.image, prompt, self.reward_metadata(result.final_latent, metadata)

    @staticmethod
    def reward_metadata(latent: torch.Tensor, metadata: dict) -> dict:
        """What rewards see besides the image: the prompt's metadata and the clean latent
        (for latent reward models, which skip the VAE decode)."""
        return {**metadata, "latent": latent}

    def reward_inputs(self, batch: DiffusionBatch):
        metadata = [self.reward_metadata(batch.final_latents[i], m) for i, m in enumerate(batch.metadata)]
        return batch.images, batch.prompts, metadata

    def rollout_metrics(self, batch: DiffusionBatch) -> dict[str, float]:
        return {}

    @torch.no_grad()
    def validate(self, items: list[PromptItem], step: int, rewards, output_dir: Path, logger) -> dict[str, float]:
        """Deterministic samples (ODE, noise 0) with more steps: the same images each time for
        the same weights, so the grid shows what training changed."""
        t = self.cfg.trainer
        requests, shown = [], []
        for g, item in enumerate(items):
            for k in range(t.val_samples_per_prompt):
                requests.append(
                    self._request(item, derive_seed(t.val_seed, "val", g, k), num_steps=t.val_num_steps,
                                  kernel="ode", noise_level=0.0, sde_window_size=0, sde_window_range=None)
                )
                shown.append(item)
        if not requests:
            return {}
        results = self.engine.generate(requests, timeout_s=self.cfg.rollout.timeout_s)
        images = torch.stack([res.image for res in results])
        reward = rewards.score(images, [i.prompt for i in shown], [i.metadata for i in shown])
        captions = [f"{i.prompt} | {s:.3g}" for i, s in zip(shown, reward.total.tolist())]
        grid = make_grid(images, nrow=max(2, t.val_samples_per_prompt), captions=captions)
        atomic_save_image(grid, output_dir / "samples" / f"val_step_{step:06d}.png")
        logger.log_image("val/samples", np.asarray(grid), step)
        return {f"val/{k}": v for k, v in reward.metrics.items()}

    def close(self) -> None:
        self.engine.close()

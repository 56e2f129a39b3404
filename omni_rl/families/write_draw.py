"""The write-draw family: a prompt-writer language model, then an image model drawing what it wrote.

Two models, one trajectory (verl-omni's DualGRPO idea): the writer's R tokens, then the K trained
denoising steps of an image conditioned on its text (`WriteDrawModelBase`). It is the think-draw
family with the plan written by a separate model: the same batch (`[N, R + K]` action rows), the
same rollout, one advantage from the image's reward (group-normalised over a prompt's samples) for
both; the writer's tokens get the token loss `plan_policy_loss` (chunk 0), the image's steps
`algo.policy_loss` (one chunk each). A frozen model (`model.adapter_options.train_image`,
`model.adapter_options.writer.trained`) has no chunk: its log-probs are recorded and checked, never trained.

Not here (refused at load): Ray or sharded training (two models, two optimizer groups: only
`trainer.backend=local` holds them), a KL term (no reference for the writer), and what the
think-draw family refuses.
"""
from __future__ import annotations

import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.data.think_draw_batch import ThinkDrawBatch
from omni_rl.families.base import register_family
from omni_rl.families.think_draw import ThinkDrawFamily, ThinkDrawOptions
from omni_rl.models.write_draw import WriteDrawModelBase


@register_family("write_draw")
class WriteDrawFamily(ThinkDrawFamily):
    Options = ThinkDrawOptions  # the plan's options train the writer's text

    def __init__(self, cfg: OmniConfig, model: WriteDrawModelBase, options: ThinkDrawOptions | None = None,
                 trains: bool = True):
        super().__init__(cfg, model, options, trains)
        # The loss's chunks: the writer's text (one) where it trains, then the image's steps where it trains.
        self.writer_chunks = 1 if model.trains_writer else 0
        self.image_trains = model.trains_image

    @classmethod
    def check_config(cls, cfg: OmniConfig) -> None:
        t = cfg.trainer
        if t.backend != "local":
            raise ConfigError(f"trainer.backend={t.backend!r}: a write-draw run trains two models (the writer and the "
                              f"image model, an optimizer group each), which only the one-process backend holds; set "
                              f"trainer.backend=local")
        if cfg.algo.kl_coef != 0:
            raise ConfigError(f"algo.kl_coef={cfg.algo.kl_coef!r}: expected 0 for a write-draw run (the writer has no "
                              f"reference policy here); set algo.kl_coef=0")
        super().check_config(cfg)

    def fit_prompts(self, items: list, what: str = "data.prompts") -> list:
        """The image's rules, and every request's writer context within `writer.max_prompt_tokens`
        (checked once here, before any step)."""
        items = super().fit_prompts(items, what)
        self.model.writer_context([item.prompt for item in items])
        return items

    # --- the actor half -------------------------------------------------------------------
    def num_chunks(self, batch: ThinkDrawBatch) -> int:
        return self.writer_chunks + (self.image.num_chunks(batch.image) if self.image_trains else 0)

    def loss(self, micro: ThinkDrawBatch, chunk: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if chunk < self.writer_chunks:
            return super().loss(micro, 0)
        return self.image.loss(micro.image_half(), chunk - self.writer_chunks)

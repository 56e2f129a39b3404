"""The forward-process family: a diffusion model trained with `diffusion_nft` or `diffusion_dpo`.

The diffusion family's rollout half, and an actor half that replays nothing: each chunk noises
the clean latents with its own seeded (t, eps) (`forward_draws`), so any kernel may sample. The
losses get what they declare (`old_velocity` from the EMA, `ref_velocity`, a `PairBatch`).
"""
from __future__ import annotations

import logging

import torch

from omni_rl.algos import latent_streams as ls
from omni_rl.algos.forward_losses import ForwardLoss, ForwardLossInput
from omni_rl.algos.forward_losses import FORWARD_LOSSES
from omni_rl.algos.modality_routing import routed_loss, stream_columns
from omni_rl.config.schema import OmniConfig
from omni_rl.families.base import BehaviourPolicy, register_family
from omni_rl.families.diffusion import DiffusionFamily, DiffusionOptions
from omni_rl.families.ema import ParameterEMA
from omni_rl.families.forward_draws import forward_draws, noised
from omni_rl.families.preference_pairs import PairBatch, best_worst_pairs
from omni_rl.models.conditioning import Conditioning

log = logging.getLogger(__name__)
EMA_PREFIX = "nft_ema/"


def pair_metrics(batch) -> dict[str, float]:
    """A scored rollout's best-vs-worst pairs for a pairwise loss: how many, and the groups whose
    rewards tie (no pair). For the driver's step metrics, before the update makes the pairs."""
    if batch.rewards is None:
        return {}
    winners, _ = best_worst_pairs(batch.rewards, batch.group_index)
    groups = int(torch.unique(batch.group_index).numel())
    return {"actor/dpo_pairs": float(len(winners)), "actor/dpo_tied_groups": float(groups - len(winners))}


@register_family("forward_process")
class ForwardProcessFamily(DiffusionFamily):
    rollout_is_levels = ()  # no log-probs, nothing to correct
    losses = FORWARD_LOSSES

    def __init__(self, cfg: OmniConfig, model, options: DiffusionOptions | None = None, trains: bool = True):
        super().__init__(cfg, model, options, trains)
        self.loss_fn: ForwardLoss | None = self.policy_loss
        self.num_timesteps = self.options.forward_num_timesteps
        self.timestep_sampling = self.options.forward_timestep_sampling
        self.reads = self.loss_class.reads
        self.pairwise = self.loss_class.pairwise
        # DiffusionNFT's old policy is actor-half state: built only where the weights are trained.
        self.ema = self._new_ema() if trains and "old_velocity" in self.reads else None

    @classmethod
    def variant(cls, cfg: OmniConfig) -> type:
        return cls

    def _new_ema(self) -> ParameterEMA:
        params = {n: p for n, p in self.model.trainable_root().named_parameters() if p.requires_grad}
        return ParameterEMA(params, self.loss_fn.options.ema_decay)

    # --- the rollout half -----------------------------------------------------------------
    def rollout_metrics(self, batch) -> dict[str, float]:
        return pair_metrics(batch) if self.pairwise else {}

    # --- what the update loop asks --------------------------------------------------------
    @property
    def reads_old_means(self) -> bool:
        return False

    def num_chunks(self, batch) -> int:
        return self.num_timesteps

    @torch.no_grad()
    def behaviour_policy(self, batch, micro_batch_size: int) -> BehaviourPolicy:
        """The rollout's own log-probs, unscored: no forward-process loss reads them."""
        return BehaviourPolicy(batch.rollout_log_probs, torch.ones_like(batch.rollout_log_probs))

    def train_items(self, batch):
        """A `PairBatch` of the rollout's best-vs-worst pairs for a pairwise loss, else the batch;
        a `PairBatch` itself (offline pairs, `data.preference_file`) as it is."""
        if isinstance(batch, PairBatch):
            return batch
        return PairBatch.from_rollout(batch) if self.pairwise else batch

    def after_optimizer_step(self) -> None:
        if self.ema is not None:
            self.ema.update()

    def state_tensors(self) -> dict[str, torch.Tensor]:
        if self.ema is None:
            return {}
        return {EMA_PREFIX + n: t for n, t in self.ema.state_dict().items()}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.ema is None:
            return
        mine = {k.removeprefix(EMA_PREFIX): v for k, v in tensors.items() if k.startswith(EMA_PREFIX)}
        if not mine:
            log.warning("the checkpoint holds no DiffusionNFT EMA (a run of another loss): the EMA restarts "
                        "from the resumed weights")
            self.ema = self._new_ema()
            return
        self.ema.load_state_dict(mine)

    # --- the loss -------------------------------------------------------------------------
    def _velocity(self, latents, t, conditioning, guidance_scale) -> torch.Tensor:
        return ls.flat(self.model.predict_velocity(latents, t, conditioning, guidance_scale)).to(torch.float32)

    def loss(self, micro, j: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        device = self.model.device
        if self.pairwise:
            t, eps = forward_draws(micro.seeds, j, micro.chosen, self.timestep_sampling)
            t = t.to(device)
            x_w, u_w = noised(micro.chosen, eps, t)
            x_l, u_l = noised(micro.rejected, eps, t)
            clean = ls.flat(ls.cat([ls.to(micro.chosen, device), ls.to(micro.rejected, device)]))
            latents, target, t = ls.cat([x_w, x_l]), torch.cat([u_w, u_l]), torch.cat([t, t])
            conditioning = Conditioning.cat([micro.conditioning, micro.conditioning])
            advantages = None
        else:
            t, eps = forward_draws(micro.sample_seeds, j, micro.final_latents, self.timestep_sampling)
            t = t.to(device)
            latents, target = noised(micro.final_latents, eps, t)
            clean = ls.flat(ls.to(micro.final_latents, device))
            conditioning, advantages = micro.conditioning, micro.advantages.to(device)
        extras = {}
        # The constant forwards first: the EMA swap must not happen while a graph holds the weights.
        if "old_velocity" in self.reads:
            with torch.no_grad(), self.ema.swapped_in():
                extras["old_velocity"] = self._velocity(latents, t, conditioning, micro.guidance_scale)
        if "ref_velocity" in self.reads:
            with torch.no_grad(), self.model.reference_policy():
                extras["ref_velocity"] = self._velocity(latents, t, conditioning, micro.guidance_scale)
        velocity = self._velocity(latents, t, conditioning, micro.guidance_scale)
        noisy = ls.flat(latents).to(torch.float32)
        routed = None if self.pairwise else micro.stream_advantages
        if routed is None:
            loss, metrics = self.loss_fn(ForwardLossInput(
                velocity=velocity, target=target, timesteps=t, noisy=noisy, clean=clean, advantages=advantages, **extras,
            ))
        else:
            # Modality routing (omni_rl.algos.modality_routing): the loss on each stream's columns
            # of the flat velocity, with that stream's advantage.
            def part(name: str, cols: slice, advantage: torch.Tensor):
                return self.loss_fn(ForwardLossInput(
                    velocity=velocity[:, cols], target=target[:, cols], timesteps=t, noisy=noisy[:, cols],
                    clean=clean[:, cols], advantages=advantage, **{k: v[:, cols] for k, v in extras.items()},
                ))

            loss, metrics = routed_loss(part, stream_columns(micro.final_latents), ls.to(routed, device))
        metrics = {("loss/policy" if k == "policy_loss" else f"loss/{k}"): v for k, v in metrics.items()}
        metrics["loss/timestep_mean"] = t.detach().mean()
        metrics["loss/total"] = loss.detach()
        return loss, metrics

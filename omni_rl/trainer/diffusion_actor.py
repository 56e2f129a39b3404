"""The diffusion actor: replays stored trajectories through the current policy.

Training is teacher-forced: for a window step j of sample i the stored latent x_j and its stored
successor x_{j+1} are fed back; the policy's velocity at (x_j, sigma_j) gives the transition mean,
and the very kernel that sampled (`omni_rl.algos.flow_sde`) scores x_{j+1} under it. So the
rollout's log-prob and the trainer's are the same function of the same inputs, and on-policy
their ratio is 1.

`loss(micro_batch, j)` is what the training engine is handed: policy loss on (sample, step j)
entries plus, when `algo.kl_coef > 0`, the KL to the reference (LoRA disabled) policy.
"""
from __future__ import annotations

import torch

from omni_rl.algos.flow_sde import StepOutput, get_step_kernel
from omni_rl.algos.policy_losses import PolicyLossInput, get_diffusion_kl, get_policy_loss
from omni_rl.config.schema import AlgoConfig
from omni_rl.data.diffusion_batch import DiffusionBatch
from omni_rl.models.diffusion import DiffusionModelBase


class DiffusionActor:
    def __init__(self, model: DiffusionModelBase, algo: AlgoConfig):
        self.model = model
        self.algo = algo
        self.policy_loss = get_policy_loss(algo.policy_loss)
        self.kl_form = get_diffusion_kl(algo.kl_form)

    def step(self, batch: DiffusionBatch, j: int) -> StepOutput:
        """Score window step j of every sample in `batch` under the current policy."""
        x = batch.latents[:, j]
        velocity = self.model.predict_velocity(x, batch.sigmas[:, j], batch.conditioning, batch.guidance_scale)
        return get_step_kernel(batch.kernel)(
            model_output=velocity,
            sigma=batch.sigmas[:, j],
            sigma_next=batch.sigmas_next[:, j],
            sample=x.to(velocity.device),
            noise_level=batch.noise_levels[:, j],
            prev_sample=batch.latents[:, j + 1].to(velocity.device),
        )

    def num_chunks(self, batch: DiffusionBatch) -> int:
        return batch.num_train_steps  # one backward per denoising step

    @torch.no_grad()
    def behaviour_policy(self, batch: DiffusionBatch, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """Log-probs [N, W] and transition means [N, W, *latent] of the current weights."""
        log_probs, means = [], []
        for start in range(0, len(batch), micro_batch_size):
            micro = batch.select(range(start, min(start + micro_batch_size, len(batch))))
            steps = [self.step(micro, j) for j in range(batch.num_train_steps)]
            log_probs.append(torch.stack([s.log_prob for s in steps], dim=1).cpu())
            means.append(torch.stack([s.mean for s in steps], dim=1).cpu())
        log_probs = torch.cat(log_probs)
        return {"log_probs": log_probs, "mask": torch.ones_like(log_probs), "means": torch.cat(means)}

    def loss(self, micro: DiffusionBatch, j: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = self.step(micro, j)
        device = out.log_prob.device
        dt = (micro.sigmas_next[:, j] - micro.sigmas[:, j]).to(device)
        algo = self.algo
        loss, metrics = self.policy_loss(
            PolicyLossInput(
                log_prob=out.log_prob,
                old_log_prob=micro.old_log_probs[:, j].to(device),
                advantages=micro.advantages.to(device),
                clip_low=algo.clip_range,
                clip_high=algo.clip_range if algo.clip_range_high is None else algo.clip_range_high,
                adv_clip_max=algo.adv_clip_max,
                mean=out.mean,
                old_mean=micro.old_means[:, j].to(device),
                std=out.std,
                dt=dt,
                kl_threshold=algo.kl_threshold,
            )
        )
        # The loss functions name their main term `policy_loss`; the metric table calls it loss/policy.
        metrics = {("loss/policy" if k == "policy_loss" else f"loss/{k}"): v for k, v in metrics.items()}
        metrics["loss/log_prob_mean"] = out.log_prob.detach().mean()
        if algo.kl_coef > 0:
            with torch.no_grad(), self.model.reference_policy():
                ref = self.step(micro, j)
            kl = self.kl_form(out.mean, ref.mean, out.std, dt).mean()
            loss = loss + algo.kl_coef * kl
            metrics["loss/kl"] = kl.detach()
        metrics["loss/total"] = loss.detach()
        return loss, metrics

"""The token actor: scores stored responses under the current policy (teacher forcing).

`loss(micro_batch, 0)` is what the training engine is handed: the registered policy loss on the
response tokens (masked), plus, when `algo.kl_coef > 0`, the KL estimator (k1/k3) to the
reference policy (the base model with LoRA disabled). Token log-probs come from
`AutoregressiveModelBase.token_log_probs`, the function the rollout engine recorded.
"""
from __future__ import annotations

import torch

from omni_rl.algos.policy_losses import PolicyLossInput, get_policy_loss
from omni_rl.config.schema import AlgoConfig
from omni_rl.data.text_batch import TextBatch
from omni_rl.models.autoregressive import AutoregressiveModelBase
from omni_rl.rollout.text_native import collate_media


class TokenActor:
    def __init__(self, model: AutoregressiveModelBase, algo: AlgoConfig):
        self.model = model
        self.algo = algo
        self.policy_loss = get_policy_loss(algo.policy_loss)

    def num_chunks(self, batch: TextBatch) -> int:
        return 1  # one backward per micro-batch: every token of a response at once

    def log_probs(self, batch: TextBatch) -> torch.Tensor:
        return self.model.token_log_probs(
            batch.sequences, batch.attention_mask, batch.prompt_width, batch.temperature, collate_media(batch.media)
        )

    @torch.no_grad()
    def behaviour_policy(self, batch: TextBatch, micro_batch_size: int) -> dict[str, torch.Tensor]:
        parts = []
        for start in range(0, len(batch), micro_batch_size):
            micro = batch.select(range(start, min(start + micro_batch_size, len(batch))))
            parts.append(self.log_probs(micro).cpu())
        return {"log_probs": torch.cat(parts), "mask": batch.response_mask}

    def loss(self, micro: TextBatch, chunk: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        log_prob = self.log_probs(micro)
        device = log_prob.device
        algo = self.algo
        ref = None
        if algo.kl_coef > 0:
            with torch.no_grad(), self.model.reference_policy():
                ref = self.log_probs(micro)
        loss, metrics = self.policy_loss(
            PolicyLossInput(
                log_prob=log_prob,
                old_log_prob=micro.old_log_probs.to(device),
                advantages=micro.advantages.to(device)[:, None],
                mask=micro.response_mask.to(device),
                clip_low=algo.clip_range,
                clip_high=algo.clip_range if algo.clip_range_high is None else algo.clip_range_high,
                adv_clip_max=algo.adv_clip_max,
                loss_agg_mode=algo.loss_agg_mode,
                ref_log_prob=ref,
                kl_coef=algo.kl_coef,
                kl_estimator=algo.kl_estimator,
                tau_pos=algo.tau_pos,
                tau_neg=algo.tau_neg,
            )
        )
        metrics = {("loss/policy" if k == "policy_loss" else f"loss/{k}"): v for k, v in metrics.items()}
        metrics["loss/total"] = loss.detach()
        return loss, metrics

"""The autoregressive (text / omni) family: chat requests, padded batches, and token replay.

Rollout half: prompts become chat messages (plus media for omni models) through the adapter's
chat template; the engine samples `samples_per_prompt` responses per prompt, each with its own
seed; the rewards score the decoded response texts; validation writes the responses with their
rewards to `samples/val_step_NNNNNN.jsonl`.

Actor half: teacher forcing of the stored responses. `loss(micro_batch, 0)` is the registered
policy loss on the response tokens (masked), plus, when `algo.kl_coef > 0`, the KL estimator
(k1/k3) to the reference policy (the base model with LoRA disabled). Token log-probs come from
`AutoregressiveModelBase.token_log_probs`, the function the rollout engine recorded; the loss
also reports the gap between the stored old log-probs and this forward's on the response tokens
(`rollout_corr/*`, kept by the update for its first mini-batch).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from omni_rl.algos.policy_losses import PolicyLossInput
from omni_rl.config.schema import OmniConfig
from omni_rl.data.prompts import PromptItem
from omni_rl.data.text_batch import TextBatch
from omni_rl.families.base import BehaviourPolicy, ModelFamily, register_family
from omni_rl.families.scored_rollout import scored_rollout
from omni_rl.models.autoregressive import AutoregressiveModelBase, PromptInputs
from omni_rl.rollout.text_native import collate_media
from omni_rl.rollout.text_types import TextRequest
from omni_rl.utils.atomic import atomic_write_text
from omni_rl.utils.seeding import derive_seed


def messages_of(item: PromptItem) -> list[dict]:
    messages = getattr(item, "messages", None)
    return list(messages) if messages else [{"role": "user", "content": item.prompt}]


@register_family("autoregressive")
class TextFamily(ModelFamily):
    batch_type = TextBatch

    def __init__(self, cfg: OmniConfig, model: AutoregressiveModelBase):
        super().__init__(cfg, model)
        self._encoded: dict[int, PromptInputs] = {}

    # --- the rollout half -----------------------------------------------------------------
    def _encode(self, item: PromptItem) -> PromptInputs:
        key = id(item)  # prompt items live for the whole run; encode each once
        if key not in self._encoded:
            self._encoded[key] = self.model.encode_prompt(messages_of(item), getattr(item, "media", None))
        return self._encoded[key]

    def request(self, item: PromptItem, seed: int, **changes) -> TextRequest:
        r = self.cfg.rollout
        fields = dict(
            prompt=self._encode(item), seed=seed, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
            top_p=r.top_p, stop_token_ids=tuple(r.stop_token_ids),
        )
        fields.update(changes)
        return TextRequest(**fields)

    def rollout(self, engine, prompts: list[PromptItem], step: int, score=None) -> tuple[TextBatch, list]:
        """The step's batch; with `score(sample, prompt, metadata, future)` each response is
        handed to the reward scorer once the engine completes it (`scored_rollout`: at once on
        Ray workers, after the whole rollout in one process, whose text engine is synchronous)."""
        n = self.cfg.trainer.samples_per_prompt
        requests, texts, metadata, groups = [], [], [], []
        for g, item in enumerate(prompts):
            for k in range(n):
                requests.append(self.request(item, derive_seed(self.cfg.trainer.seed, "train", step, g * n + k)))
                texts.append(item.prompt)
                metadata.append(item.metadata)
                groups.append(g)
        results, reward_futures = scored_rollout(
            engine, requests, texts, metadata, score, self._reward_input, self.cfg.rollout.timeout_s
        )
        return TextBatch.from_results(results, texts, metadata, groups, self.model.pad_token_id), reward_futures

    @staticmethod
    def _reward_input(result, prompt: str, metadata: dict) -> tuple:
        return result.text, prompt, metadata

    def reward_inputs(self, batch: TextBatch):
        return batch.texts, batch.prompts, batch.metadata

    def rollout_metrics(self, batch: TextBatch) -> dict[str, float]:
        lengths = batch.response_mask.sum(1)
        return {
            "response/length_mean": float(lengths.mean()),
            "response/length_max": float(lengths.max()),
            # Responses cut at rollout.max_new_tokens without a stop token.
            "response/clip_ratio": sum(f == "length" for f in batch.finish_reasons) / len(batch),
        }

    @torch.no_grad()
    def validate(self, engine, items: list[PromptItem], step: int, rewards, output_dir: Path, logger) -> dict[str, float]:
        """Greedy-ish validation: temperature as configured, fixed seeds, so runs compare."""
        t = self.cfg.trainer
        requests, shown = [], []
        for g, item in enumerate(items):
            for k in range(t.val_samples_per_prompt):
                requests.append(self.request(item, derive_seed(t.val_seed, "val", g, k)))
                shown.append(item)
        if not requests:
            return {}
        results = engine.generate(requests)
        texts = [r.text for r in results]
        reward = rewards.score(texts, [i.prompt for i in shown], [i.metadata for i in shown])
        lines = [
            json.dumps({"prompt": i.prompt, "response": text, "reward": score}, ensure_ascii=False)
            for i, text, score in zip(shown, texts, reward.total.tolist())
        ]
        atomic_write_text(output_dir / "samples" / f"val_step_{step:06d}.jsonl", "\n".join(lines) + "\n")
        return {f"val/{k}": v for k, v in reward.metrics.items()}

    # --- the actor half -------------------------------------------------------------------
    def num_chunks(self, batch: TextBatch) -> int:
        return 1  # one backward per micro-batch: every token of a response at once

    def log_probs(self, batch: TextBatch) -> torch.Tensor:
        return self.model.token_log_probs(
            batch.sequences, batch.attention_mask, batch.prompt_width, batch.temperature, collate_media(batch.media)
        )

    @torch.no_grad()
    def behaviour_policy(self, batch: TextBatch, micro_batch_size: int) -> BehaviourPolicy:
        parts = []
        for start in range(0, len(batch), micro_batch_size):
            micro = batch.select(range(start, min(start + micro_batch_size, len(batch))))
            parts.append(self.log_probs(micro).cpu())
        return BehaviourPolicy(torch.cat(parts), batch.response_mask)

    def loss(self, micro: TextBatch, chunk: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        log_prob = self.log_probs(micro)
        device = log_prob.device
        algo = self.algo
        ref = None
        if algo.kl_coef > 0:
            with torch.no_grad(), self.model.reference_policy():
                ref = self.log_probs(micro)
        old_log_prob = micro.old_log_probs.to(device)
        mask = micro.response_mask.to(device)
        loss, metrics = self.policy_loss(
            PolicyLossInput(
                log_prob=log_prob,
                old_log_prob=old_log_prob,
                advantages=micro.advantages.to(device)[:, None],
                mask=mask,
                clip_low=algo.clip_range,
                clip_high=algo.clip_range if algo.clip_range_high is None else algo.clip_range_high,
                adv_clip_max=algo.adv_clip_max,
                loss_agg_mode=algo.loss_agg_mode,
                ref_log_prob=ref,
                kl_coef=algo.kl_coef,
                kl_estimator=algo.kl_estimator,
                tau_pos=algo.tau_pos,
                tau_neg=algo.tau_neg,
                clip_ratio_c=algo.clip_ratio_c,
                kl_clamp=algo.kl_clamp,
                # seq-mean-token-sum-norm's constant: Dr.GRPO's response budget unless given.
                loss_scale_factor=(
                    algo.loss_scale_factor if algo.loss_scale_factor is not None else self.cfg.rollout.max_new_tokens
                ),
            )
        )
        metrics = {("loss/policy" if k == "policy_loss" else f"loss/{k}"): v for k, v in metrics.items()}
        valid = mask.bool()
        gap = (log_prob.detach() - old_log_prob)[valid].abs()
        if gap.numel():
            metrics["rollout_corr/logprob_abs_diff_max"] = gap.max()
            metrics["rollout_corr/logprob_abs_diff_mean"] = gap.mean()
        metrics["loss/total"] = loss.detach()
        return loss, metrics

"""The autoregressive (text / omni) family's side of the trainer.

Prompts become chat messages (plus media for omni models) through the adapter's chat template;
the native text engine samples `samples_per_prompt` responses per prompt, each with its own
seed; the rewards score the decoded response texts; validation writes the responses with their
rewards to `samples/val_step_NNNNNN.jsonl`.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from omni_rl.config.schema import OmniConfig
from omni_rl.data.prompts import PromptItem
from omni_rl.data.text_batch import TextBatch
from omni_rl.models.autoregressive import AutoregressiveModelBase, PromptInputs
from omni_rl.rollout.text_native import NativeTextEngine
from omni_rl.rollout.text_types import TextRequest
from omni_rl.trainer.scored_rollout import scored_rollout
from omni_rl.trainer.token_actor import TokenActor
from omni_rl.utils.atomic import atomic_write_text
from omni_rl.utils.seeding import derive_seed


def messages_of(item: PromptItem) -> list[dict]:
    messages = getattr(item, "messages", None)
    return list(messages) if messages else [{"role": "user", "content": item.prompt}]


class TextStage:
    def __init__(self, cfg: OmniConfig, model: AutoregressiveModelBase):
        self.cfg = cfg
        self.model = model
        self.engine = NativeTextEngine(model, cfg.rollout.max_num_seqs)
        self.actor = TokenActor(model, cfg.algo)
        self._encoded: dict[int, PromptInputs] = {}

    def _encode(self, item: PromptItem) -> PromptInputs:
        key = id(item)  # prompt items live for the whole run; encode each once
        if key not in self._encoded:
            self._encoded[key] = self.model.encode_prompt(messages_of(item), getattr(item, "media", None))
        return self._encoded[key]

    def _request(self, item: PromptItem, seed: int, **changes) -> TextRequest:
        r = self.cfg.rollout
        fields = dict(
            prompt=self._encode(item), seed=seed, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
            top_p=r.top_p, stop_token_ids=tuple(r.stop_token_ids),
        )
        fields.update(changes)
        return TextRequest(**fields)

    def rollout(self, prompts: list[PromptItem], step: int, score=None) -> tuple[TextBatch, list]:
        """The step's batch; with `score(sample, prompt, metadata, future)` each response is
        handed to the reward scorer once the engine completes it (`scored_rollout`: at once on
        Ray workers, after the whole rollout in one process, whose text engine is synchronous)."""
        n = self.cfg.trainer.samples_per_prompt
        requests, texts, metadata, groups = [], [], [], []
        for g, item in enumerate(prompts):
            for k in range(n):
                requests.append(self._request(item, derive_seed(self.cfg.trainer.seed, "train", step, g * n + k)))
                texts.append(item.prompt)
                metadata.append(item.metadata)
                groups.append(g)
        results, reward_futures = scored_rollout(
            self.engine, requests, texts, metadata, score, self._reward_input, self.cfg.rollout.timeout_s
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
    def validate(self, items: list[PromptItem], step: int, rewards, output_dir: Path, logger) -> dict[str, float]:
        """Greedy-ish validation: temperature as configured, fixed seeds, so runs compare."""
        t = self.cfg.trainer
        requests, shown = [], []
        for g, item in enumerate(items):
            for k in range(t.val_samples_per_prompt):
                requests.append(self._request(item, derive_seed(t.val_seed, "val", g, k)))
                shown.append(item)
        if not requests:
            return {}
        results = self.engine.generate(requests)
        texts = [r.text for r in results]
        reward = rewards.score(texts, [i.prompt for i in shown], [i.metadata for i in shown])
        lines = [
            json.dumps({"prompt": i.prompt, "response": text, "reward": score}, ensure_ascii=False)
            for i, text, score in zip(shown, texts, reward.total.tolist())
        ]
        atomic_write_text(output_dir / "samples" / f"val_step_{step:06d}.jsonl", "\n".join(lines) + "\n")
        return {f"val/{k}": v for k, v in reward.metrics.items()}

    def close(self) -> None:
        self.engine.close()

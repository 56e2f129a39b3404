"""The autoregressive (text / omni) family: chat requests, padded batches, and token replay.

Rollout half: prompts become chat messages (plus media for omni models) through the adapter's
chat template; the engine samples `samples_per_prompt` responses per prompt, each with its own
seed; the rewards score the decoded response texts; validation writes the responses with their
rewards to `samples/val_step_NNNNNN.jsonl`.

Options (`TextOptions`, set in `algo.family_options`, checked at load): how responses are
sampled (`temperature`, `top_p`, `max_new_tokens`, `stop_token_ids`; `TokenSamplingOptions` holds
the two the think-draw family's plans share) and how long a prompt may be (`max_prompt_tokens`,
`overlong_prompts`: `omni_rl.data.prompt_length.PromptLimitOptions`).

Prompt length: `fit_prompts(items, what)` measures every prompt once, as the model sees it
(chat template included), when the prompts load, and applies `overlong_prompts` to those
over the limit (`max_prompt_tokens`, by default the model's context less
`max_new_tokens`): "error" stops the run at once naming the prompt, "truncate" keeps
its end (`omni_rl.data.prompt_length` says how and why), "drop" leaves it out; truncated and
dropped prompts are counted in one warning line, and `response/prompt_truncated_ratio` is the
share of a step's samples whose prompt was truncated. Every encoding is checked as well, so a
prompt that reaches a request without `fit_prompts` is refused or truncated in the same way
before any token is generated for it.

Actor half: teacher forcing of the stored responses. `loss(micro_batch, 0)` is the registered
policy loss (built once from `algo.loss_options` and `algo.kl_coef`) on the response tokens
(masked; each weighted by the rollout correction's `batch.rollout_is_weights` when the trainer
computed them: `algo.rollout_correction`), plus, when `algo.kl_coef > 0`, the KL estimate
(the loss's k1/k3) to the reference policy (the base model with LoRA disabled). Token log-probs come from
`AutoregressiveModelBase.token_log_probs`, the function the rollout engine recorded; the loss
also reports the gap between the stored old log-probs and this forward's on the response tokens
(kept by the update for its first mini-batch: `actor/first_minibatch_logprob_abs_diff_*`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from omni_rl.algos.token_losses import SUM_NORM_MODE, TOKEN_LOSSES, TokenLoss, TokenLossInput
from omni_rl.option import option
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.data.prompt_length import PromptLengthError, PromptLimitOptions, fit_prompt_lengths, shown, truncate_to_limit
from omni_rl.data.prompts import PromptItem
from omni_rl.data.text_batch import TextBatch
from omni_rl.families.base import BehaviourPolicy, ModelFamily, register_family
from omni_rl.families.update import GAP_MAX_KEY, GAP_MEAN_KEY
from omni_rl.families.scored_rollout import scored_rollout
from omni_rl.models.autoregressive import AutoregressiveModelBase, PromptInputs
from omni_rl.rollout.backends import ROLLOUT_BACKENDS
from omni_rl.rollout.text_native import collate_media
from omni_rl.rollout.text_types import TextRequest
from omni_rl.utils.atomic import atomic_write_text
from omni_rl.utils.seeding import derive_seed

log = logging.getLogger(__name__)
# Prompt sources, for messages: the inline-list key and the key of its file.
_FILE_KEYS = {"data.prompts": "prompt_file", "data.val_prompts": "val_prompt_file"}
# Truncated and dropped prompts listed by index in the warning line, at most.
_LISTED = 3


@dataclass
class TokenSamplingOptions:
    """How tokens are sampled from a language head: the text family's responses, the think-draw
    family's plans."""

    temperature: float = option(1.0, "Sampling temperature of the response tokens (> 0); the log-probs are of "
                                     "the tempered distribution.")
    max_new_tokens: int = option(256, "The longest response in tokens; longer ones are cut and counted in "
                                      "response/clip_ratio.")

    def check(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature!r}: expected > 0")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r}: expected >= 1")


@dataclass
class TextOptions(TokenSamplingOptions, PromptLimitOptions):
    """The autoregressive family's options (`algo.family_options`): how responses are sampled
    and how long a prompt may be."""

    top_p: float = option(1.0, "Nucleus sampling: keep the smallest set of tokens of mass >= top_p (1 = all).")
    stop_token_ids: list[int] = option([], "Extra stop tokens besides the tokenizer's end-of-turn token(s).")

    def check(self) -> None:
        TokenSamplingOptions.check(self)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r}: expected in (0, 1]")
        PromptLimitOptions.check(self)


def messages_of(item: PromptItem) -> list[dict]:
    messages = getattr(item, "messages", None)
    return list(messages) if messages else [{"role": "user", "content": item.prompt}]


@register_family("autoregressive")
class TextFamily(ModelFamily):
    batch_type = TextBatch
    sample_modalities = frozenset({"text"})  # the responses
    rollout_is_levels = ("token", "sequence")  # a response token; the whole response
    losses = TOKEN_LOSSES
    Options = TextOptions

    @classmethod
    def check_config(cls, cfg: OmniConfig) -> None:
        options = cfg.algo.family_options
        if options.top_p != 1.0 and not ROLLOUT_BACKENDS.get(cfg.rollout.backend).takes_top_p:
            raise ConfigError(
                f"algo.family_options.top_p={options.top_p!r}: expected 1.0 with rollout.backend={cfg.rollout.backend} "
                f"(its log-probs renormalise over the top-p nucleus, the trainer's do not); use rollout.backend=native "
                f"for top_p < 1")

    def __init__(self, cfg: OmniConfig, model: AutoregressiveModelBase, options=None, trains: bool = True):
        super().__init__(cfg, model, options, trains)
        self._encoded: dict[int, PromptInputs] = {}
        self._truncated: set[int] = set()  # ids of the items whose prompt was cut to fit

    def build_policy_loss(self) -> TokenLoss:
        return build_token_loss(self.loss_class, self.loss_options(), self.options, self.cfg.algo.kl_coef)

    # --- prompt length --------------------------------------------------------------------
    @functools.cached_property
    def prompt_token_limit(self) -> Optional[int]:
        """The most prompt tokens a request may have, or None when nothing bounds them."""
        limit, _ = self._prompt_limit
        return limit

    @functools.cached_property
    def _prompt_limit(self) -> tuple[Optional[int], str]:
        """(limit, where it comes from in words); raises if the keys leave no room for a prompt."""
        context = self.model.context_length()
        max_new = self.options.max_new_tokens
        given = self.options.max_prompt_tokens
        if given is not None:
            if context is not None and given + max_new > context:
                raise PromptLengthError(
                    f"algo.family_options.max_prompt_tokens={given} plus algo.family_options.max_new_tokens={max_new} is "
                    f"{given + max_new} tokens, over the model's {context} positions; lower one of them "
                    f"(or set algo.family_options.max_prompt_tokens=null for {context} - {max_new} = {context - max_new})"
                )
            return given, f"algo.family_options.max_prompt_tokens={given}"
        if context is None:
            log.warning(
                "the model states no context length (no max_position_embeddings in its config, no "
                "model_max_length on its tokenizer), so prompt lengths are not checked; set "
                "algo.family_options.max_prompt_tokens to check them"
            )
            return None, "no limit"
        if context - max_new < 1:
            raise PromptLengthError(
                f"algo.family_options.max_new_tokens={max_new} leaves no room for a prompt in the model's {context} "
                f"positions; set it below {context}"
            )
        return context - max_new, f"the model's {context} positions less algo.family_options.max_new_tokens={max_new}"

    def fit_prompts(self, items: list[PromptItem], what: str = "data.prompts") -> list[PromptItem]:
        """The prompts of `items` to run, every one measured now: those over `prompt_token_limit`
        raise, are truncated or are dropped by `algo.family_options.overlong_prompts` (one warning line says how
        many). `what` is the config key the items come from ("data.prompts", "data.val_prompts")."""
        limit, limit_text = self._prompt_limit
        if limit is None:
            return list(items)
        mode = self.options.overlong_prompts
        where = self._source(what)
        given = {id(item) for item in items}

        def count_tokens(item: PromptItem) -> int:
            # The given items' encodings are kept for their requests; truncation's trial cuts are
            # not (a dead object's id can be reused).
            encoded = self._encode_unchecked(item) if id(item) in given else self._encode_uncached(item)
            return len(encoded.input_ids)

        report = fit_prompt_lengths(items, count_tokens, limit, mode, where, limit_text)
        for i in [i for i, _before, _after in report.truncated] + [i for i, _n in report.dropped]:
            self._encoded.pop(id(items[i]), None)  # the over-long original will not be sent
        self._truncated.update(id(item) for item in report.items if id(item) not in given)
        if report.truncated:
            listed = ", ".join(f"prompt {i} ({before} -> {after})" for i, before, after in report.truncated[:_LISTED])
            more = f" and {len(report.truncated) - _LISTED} more" if len(report.truncated) > _LISTED else ""
            log.warning(
                "%s: %d of %d prompts are over the %d-token limit (%s) and were truncated to their last "
                "tokens (algo.family_options.overlong_prompts=truncate): %s%s", where, len(report.truncated), len(items),
                limit, limit_text, listed, more,
            )
        if report.dropped:
            listed = ", ".join(f"prompt {i} ({n} tokens)" for i, n in report.dropped[:_LISTED])
            more = f" and {len(report.dropped) - _LISTED} more" if len(report.dropped) > _LISTED else ""
            log.warning(
                "%s: %d of %d prompts are over the %d-token limit (%s) and were dropped "
                "(algo.family_options.overlong_prompts=drop): %s%s; %d prompts remain", where, len(report.dropped),
                len(items), limit, limit_text, listed, more, len(report.items),
            )
        return report.items

    def _source(self, what: str) -> str:
        data = self.cfg.data
        file_key = _FILE_KEYS.get(what)
        inline = getattr(data, what.split(".", 1)[1], None) if what.startswith("data.") else None
        file = getattr(data, file_key, None) if file_key else None
        return f"data.{file_key}={file!r}" if inline is None and file is not None else what

    def _encode_uncached(self, item: PromptItem) -> PromptInputs:
        return self.model.encode_prompt(messages_of(item), getattr(item, "media", None))

    def _count_uncached(self, item: PromptItem) -> int:
        return len(self._encode_uncached(item).input_ids)

    def _encode_unchecked(self, item: PromptItem) -> PromptInputs:
        key = id(item)  # prompt items live for the whole run; encode each once
        if key not in self._encoded:
            self._encoded[key] = self._encode_uncached(item)
        return self._encoded[key]

    # --- the rollout half -----------------------------------------------------------------
    def _encode(self, item: PromptItem) -> PromptInputs:
        """The prompt's encoding, within the limit: a prompt that did not go through
        `fit_prompts` is refused or truncated here, before any request is made of it."""
        encoded = self._encode_unchecked(item)
        limit, limit_text = self._prompt_limit
        if limit is None or len(encoded.input_ids) <= limit:
            return encoded
        n = len(encoded.input_ids)
        mode = self.options.overlong_prompts
        if mode == "truncate":
            cut = truncate_to_limit(item, self._count_uncached, limit)
            if cut is not None:
                encoded = self._encoded[id(item)] = self._encode_uncached(cut)
                self._truncated.add(id(item))
                log.warning(
                    "prompt %s is %d tokens, over the %d-token limit (%s); truncated to its last %d tokens "
                    "(algo.family_options.overlong_prompts=truncate)", shown(item), n, limit, limit_text, len(encoded.input_ids),
                )
                return encoded
        hint = (
            "shorten it, or set algo.family_options.overlong_prompts=truncate (keep its last tokens) or drop (leave it out)"
            if mode == "error" else
            "algo.family_options.overlong_prompts=drop leaves prompts out when they load (TextFamily.fit_prompts), which "
            "this one did not go through; shorten it or use algo.family_options.overlong_prompts=truncate"
            if mode == "drop" else "it cannot be cut to fit; shorten it"
        )
        raise PromptLengthError(
            f"prompt {shown(item)} is {n} tokens with the chat template, over the {limit}-token limit "
            f"({limit_text}); {hint}"
        )

    def request(self, item: PromptItem, seed: int, **changes) -> TextRequest:
        o = self.options
        fields = dict(
            prompt=self._encode(item), seed=seed, max_new_tokens=o.max_new_tokens, temperature=o.temperature,
            top_p=o.top_p, stop_token_ids=tuple(o.stop_token_ids),
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
        batch = TextBatch.from_results(results, texts, metadata, groups, self.model.pad_token_id)
        if self.options.overlong_prompts == "truncate":
            batch.extras["prompt_truncated_ratio"] = sum(id(item) in self._truncated for item in prompts) / len(prompts)
        return batch, reward_futures

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
            # Responses cut at algo.family_options.max_new_tokens without a stop token.
            "response/clip_ratio": sum(f == "length" for f in batch.finish_reasons) / len(batch),
            # algo.family_options.overlong_prompts=truncate: the share of samples whose prompt was cut to fit.
            **({"response/prompt_truncated_ratio": batch.extras["prompt_truncated_ratio"]}
               if "prompt_truncated_ratio" in batch.extras else {}),
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
            TokenLossInput(
                log_prob=log_prob, old_log_prob=old_log_prob, advantages=micro.advantages.to(device)[:, None], mask=mask,
                ref_log_prob=ref,
                rollout_is_weight=None if micro.rollout_is_weights is None else micro.rollout_is_weights.to(device),
            )
        )
        metrics = {("loss/policy" if k == "policy_loss" else f"loss/{k}"): v for k, v in metrics.items()}
        metrics.update(token_gap_metrics(log_prob, old_log_prob, mask))
        metrics["loss/total"] = loss.detach()
        return loss, metrics


def build_token_loss(loss_cls: type[TokenLoss], options, sampling: TokenSamplingOptions, kl_coef: float) -> TokenLoss:
    """A token loss from its bound options (the text family's response loss, the think-draw
    family's plan loss). seq-mean-token-sum-norm's constant left null is Dr.GRPO's response
    length budget, the family's `sampling.max_new_tokens` (`algo.family_options.max_new_tokens`)."""
    if getattr(options, "loss_agg_mode", None) == SUM_NORM_MODE and options.loss_scale_factor is None:
        options = dataclasses.replace(options, loss_scale_factor=float(sampling.max_new_tokens))
    return loss_cls(options, kl_coef=kl_coef)


def token_gap_metrics(log_prob: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gap over the counted tokens (`update.GAP_*_KEY`): how far the stored old log-probs are
    from this forward's (none when no token counts)."""
    gap = (log_prob.detach() - old_log_prob)[mask.bool()].abs()
    if not gap.numel():
        return {}
    return {GAP_MAX_KEY: gap.max(), GAP_MEAN_KEY: gap.mean()}

"""The autoregressive (text / omni) family: chat requests, padded batches, and token replay.

Rollout half: prompts become chat messages (plus media) through the adapter's chat template and
each response is sampled from its own seed (`rollout.sampling_options`, `TextSampling`; prompt
limits are `TextOptions`', applied by `fit_prompts`). Actor half: teacher forcing of the stored responses with `token_log_probs`,
the function the engine recorded; the loss is the token loss on the response tokens plus, with
`algo.kl_coef > 0`, the KL to the reference (LoRA off).

Routing replay (`routing_replay`, MoE models only; `omni_rl.models.moe_routing`): `r3` replays
the experts the rollout recorded (`batch.routes`) in every trainer forward; `r2` those of the
trainer's own old-policy forward (`batch.old_routes`). A recording that does not fit the model,
or a sample without one, is an error naming the sample. No load-balancing loss is computed.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from omni_rl.agent.options import AgentOptions
from omni_rl.algos.token_losses import SUM_NORM_MODE, TOKEN_LOSSES, AggregatedTokenOptions, TokenLoss, TokenLossInput
from omni_rl.option import ComponentOptions, option
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.data.prompt_length import PromptLengthError, PromptLimitOptions, fit_prompt_lengths, shown, truncate_to_limit
from omni_rl.data.prompts import PromptItem
from omni_rl.data.text_batch import TextBatch
from omni_rl.families.base import MODEL_FAMILIES, BehaviourPolicy, ModelFamily, register_family
from omni_rl.families.update import GAP_MAX_KEY, GAP_MEAN_KEY
from omni_rl.families.scored_rollout import scored_rollout
from omni_rl.families.teachers import check_routes, route
from omni_rl.families.sampling import TextSampling, TokenSampling
from omni_rl.families.token_teachers import TokenDistillOptions, build_token_teachers, response_logits, token_distill
from omni_rl.models.autoregressive import AutoregressiveModelBase, PromptInputs
from omni_rl.models.moe_routing import RoutingReplayError, take_recorded
from omni_rl.rollout.backends import ROLLOUT_BACKENDS
from omni_rl.rollout.text_sampling import collate_media
from omni_rl.rollout.text_types import TextRequest
from omni_rl.utils.atomic import atomic_write_text
from omni_rl.utils.seeding import derive_seed

log = logging.getLogger(__name__)
# Prompt sources, for messages: the inline-list key and the key of its file.
_FILE_KEYS = {"data.prompts": "prompt_file", "data.val_prompts": "val_prompt_file"}
# Truncated and dropped prompts listed by index in the warning line, at most.
_LISTED = 3


ROUTING_REPLAY_MODES = ("off", "r3", "r2")


@dataclass
class TextOptions(PromptLimitOptions):
    """The autoregressive family's options (`algo.family_options`): how long a prompt may be and
    how a mixture-of-experts model's routes train (its sampling is `rollout.sampling_options`,
    `TextSampling`)."""

    routing_replay: str = option(
        "off", "A mixture-of-experts model's routed experts in training: off (the trainer's own top-k), r3 (replay "
               "the experts the rollout used, per token and layer) or r2 (replay those of the trainer's old-policy "
               "forward); the gate weights stay the trainer's router's.")

    def check(self) -> None:
        if self.routing_replay not in ROUTING_REPLAY_MODES:
            raise ValueError(f"routing_replay={self.routing_replay!r}: expected one of {', '.join(ROUTING_REPLAY_MODES)}")
        PromptLimitOptions.check(self)


@dataclass
class TextFamilyOptions(TextOptions, TokenDistillOptions):
    """The text family's options: prompt length, on-policy distillation's teachers, and
    the agent loop's (`agent_options`: set, the run samples multi-turn trajectories with tools)."""

    agent_options: dict[str, Any] = option({}, "The agent loop (`omni_rl.agent.options.AgentOptions`: tools, "
                                               "environment, limits); empty: one response per prompt.")

    def check(self) -> None:
        TextOptions.check(self)
        TokenDistillOptions.check(self)


def agent_options_of(options: Any) -> Optional[AgentOptions]:
    """The bound agent options of a text model's family options when they make the run agentic."""
    if isinstance(options, TextFamilyOptions) and isinstance(options.agent_options, AgentOptions) \
            and options.agent_options.enabled:
        return options.agent_options
    return None


def messages_of(item: PromptItem) -> list[dict]:
    return list(item.messages) if item.messages else [{"role": "user", "content": item.prompt}]


@register_family("autoregressive")
class TextFamily(ModelFamily):
    batch_type = TextBatch
    sample_modalities = frozenset({"text"})  # the responses
    rollout_is_levels = ("token", "sequence")  # a response token; the whole response
    losses = TOKEN_LOSSES
    Options = TextFamilyOptions
    Sampling = TextSampling

    @classmethod
    def variant(cls, cfg: OmniConfig) -> type[ModelFamily]:
        # algo.family_options.agent_options (tools or an environment): multi-turn trajectories, `families/agent.py`.
        if cls is TextFamily and agent_options_of(cfg.algo.family_options) is not None:
            return MODEL_FAMILIES.get("agent")
        return cls

    @classmethod
    def nested_option_blocks(cls, options) -> tuple[tuple[str, type, str, str], ...]:
        """The agent loop's block, bound where the recipe sets one (left empty, it stays a mapping)."""
        if isinstance(options, TextFamilyOptions) and options.agent_options:
            return (("agent_options", AgentOptions, "algo.family_options.agent_options", "the agent loop"),)
        return ()

    @classmethod
    def check_config(cls, cfg: OmniConfig) -> None:
        options, sampling = cfg.algo.family_options, cfg.rollout.sampling_options
        if sampling.top_p != 1.0 and not ROLLOUT_BACKENDS.get(cfg.rollout.backend).takes_top_p:
            raise ConfigError(
                f"rollout.sampling_options.top_p={sampling.top_p!r}: expected 1.0 with rollout.backend={cfg.rollout.backend} "
                f"(its log-probs renormalise over the top-p nucleus, the trainer's do not); use rollout.backend=native "
                f"for top_p < 1")
        if options.routing_replay == "r3" and not ROLLOUT_BACKENDS.get(cfg.rollout.backend).records_routes:
            recording = ", ".join(n for n in ROLLOUT_BACKENDS.names() if ROLLOUT_BACKENDS.get(n).records_routes)
            raise ConfigError(
                f"algo.family_options.routing_replay=r3 with rollout.backend={cfg.rollout.backend}: its results carry no "
                f"routed experts to replay; use a backend that records them ({recording}), or routing_replay=r2 / off")
        if options.routing_replay == "r2":
            if cfg.algo.old_logprob_mode == "bypass":
                raise ConfigError(
                    "algo.family_options.routing_replay=r2 with algo.old_logprob_mode=bypass: r2 replays the routes of "
                    "the trainer's old-policy forward, which bypass skips; use algo.old_logprob_mode=recompute, or r3")

    def __init__(self, cfg: OmniConfig, model: AutoregressiveModelBase, options=None, trains: bool = True):
        super().__init__(cfg, model, options, trains)
        if self.options.routing_replay != "off" and model.routing is None:
            raise ConfigError(
                f"algo.family_options.routing_replay={self.options.routing_replay}: expected a mixture-of-experts model, "
                f"but {type(model).__name__} ({cfg.model.path}) has no routers; set routing_replay=off")
        # On-policy distillation (TextFamilyOptions' teachers); a family built inside another
        # (the talker's) has none.
        distills = isinstance(self.options, TokenDistillOptions)
        self.teacher_options = list(self.options.teachers) if distills else []
        self.teachers = build_token_teachers(cfg, model, self.teacher_options) if trains and self.teacher_options else []
        self._encoded: dict[int, PromptInputs] = {}
        self._truncated: set[int] = set()  # ids of the items whose prompt was cut to fit

    def build_policy_loss(self) -> TokenLoss:
        return build_token_loss(self.loss_class, self.loss_options(), self.cfg.rollout.sampling_options,
                                self.cfg.algo.kl_coef)

    # --- prompt length --------------------------------------------------------------------
    @functools.cached_property
    def prompt_token_limit(self) -> Optional[int]:
        """The most prompt tokens a request may have, or None when nothing bounds them."""
        limit, _ = self._prompt_limit
        return limit

    def response_budget(self) -> tuple[int, str]:
        """(the most tokens after a prompt, the config key that sets it): a response's
        max_new_tokens here; a whole trajectory's for the agent family."""
        return self.cfg.rollout.sampling_options.max_new_tokens, "rollout.sampling_options.max_new_tokens"

    @functools.cached_property
    def _prompt_limit(self) -> tuple[Optional[int], str]:
        """(limit, where it comes from in words); raises if the keys leave no room for a prompt."""
        context = self.model.context_length()
        max_new, budget_key = self.response_budget()
        given = self.options.max_prompt_tokens
        if given is not None:
            if context is not None and given + max_new > context:
                raise PromptLengthError(
                    f"algo.family_options.max_prompt_tokens={given} plus {budget_key}={max_new} is "
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
                f"{budget_key}={max_new} leaves no room for a prompt in the model's {context} "
                f"positions; set it below {context}"
            )
        return context - max_new, f"the model's {context} positions less {budget_key}={max_new}"

    def fit_prompts(self, items: list[PromptItem], what: str = "data.prompts") -> list[PromptItem]:
        """The prompts of `items` to run, every one measured now: those over `prompt_token_limit`
        raise, are truncated or are dropped by `algo.family_options.overlong_prompts` (one warning line says how
        many). `what` is the config key the items come from ("data.prompts", "data.val_prompts").
        With teachers, every training prompt must have one (`teachers.check_routes`)."""
        if what == "data.prompts":
            check_routes(self.teacher_options, items, what)
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
        return self.model.encode_prompt(messages_of(item), item.media)

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
        s = self.cfg.rollout.sampling_options
        fields = dict(
            prompt=self._encode(item), seed=seed, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
            top_p=s.top_p, stop_token_ids=tuple(s.stop_token_ids), record_routes=self.options.routing_replay == "r3",
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
            # Responses cut at rollout.sampling_options.max_new_tokens without a stop token.
            "response/clip_ratio": sum(f == "length" for f in batch.finish_reasons) / len(batch),
            # algo.family_options.overlong_prompts=truncate: the share of samples whose prompt was cut to fit.
            **({"response/prompt_truncated_ratio": batch.extras["prompt_truncated_ratio"]}
               if "prompt_truncated_ratio" in batch.extras else {}),
        }

    def validation_requests(self, items: list[PromptItem]) -> tuple[list[TextRequest], list[PromptItem]]:
        """`trainer.val_samples_per_prompt` requests per item at the validation seeds (the same
        every validation, so runs compare), and the item each request shows."""
        t = self.cfg.trainer
        requests, shown = [], []
        for g, item in enumerate(items):
            for k in range(t.val_samples_per_prompt):
                requests.append(self.request(item, derive_seed(t.val_seed, "val", g, k), record_routes=False))
                shown.append(item)
        return requests, shown

    @torch.no_grad()
    def validate(self, engine, items: list[PromptItem], step: int, rewards, output_dir: Path, logger) -> dict[str, float]:
        """Greedy-ish validation: temperature as configured, fixed seeds, so runs compare."""
        requests, shown = self.validation_requests(items)
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
        """Token log-probs of the batch's responses, its routes replayed (`routing_replay`)."""
        self.set_route_replay(batch)
        return self.model.token_log_probs(
            batch.sequences, batch.attention_mask, batch.prompt_width, batch.temperature, collate_media(batch.media)
        )

    def set_route_replay(self, batch: TextBatch) -> None:
        """Set the model's replay to `batch`'s routes for its next forwards (kept until the next
        call: activation checkpointing recomputes the forward in the backward); nothing under
        `routing_replay=off`. r2 before the old-policy forward has recorded: the router's own."""
        mode = self.options.routing_replay
        if mode == "off":
            return
        routing = self.model.routing
        if mode == "r2":
            if batch.old_routes is None:
                raise RoutingReplayError(
                    f"sample 0 ({batch.prompts[0][:40]!r}) has no old-policy routes: algo.family_options.routing_replay=r2 "
                    f"replays the routes that the old-policy forward (behaviour_policy) records before the update")
            routes, mask = batch.old_routes, torch.ones(batch.old_routes.shape[:2], dtype=torch.bool)
        else:
            routes, mask = self._rollout_routes(batch)
        n, t = routes.shape[:2]
        # On the model's device once, not in every layer's hook.
        device = self.model.device
        routing.set_replay(routes.to(device).permute(2, 0, 1, 3).reshape(routes.shape[2], n * t, -1),
                           mask.to(device).reshape(n * t))

    def _rollout_routes(self, batch: TextBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(routes [N, T, L, k], mask [N, T]) of the rollout, checked against the model: every
        position that a scored log-prob depends on (the attended tokens but each row's last) has one."""
        layout = self.model.routing.layout

        def name(i: int) -> str:
            return f"sample {i} (prompt {batch.prompts[i][:40]!r})"

        if batch.routes is None:
            raise RoutingReplayError(
                f"{name(0)} has no recorded routes, which algo.family_options.routing_replay=r3 replays; rollout.backend="
                f"{self.cfg.rollout.backend} does not record routed experts (rollout.backend=native does), or set "
                f"routing_replay=off")
        for i in range(len(batch)):
            layout.check(batch.routes[i], name(i))
        needed = batch.attention_mask.bool().clone()
        last = needed.shape[1] - 1 - needed.flip(1).int().argmax(1)
        needed[torch.arange(len(batch)), last] = False
        missing = needed & ~batch.route_mask
        if missing.any():
            i = int(missing.any(1).nonzero()[0, 0])
            raise RoutingReplayError(
                f"{name(i)}: {int(missing[i].sum())} of its {int(needed[i].sum())} tokens that scored log-probs depend "
                f"on have no recorded route (algo.family_options.routing_replay=r3); the rollout engine recorded no "
                f"routes for it")
        return batch.routes, batch.route_mask

    @torch.no_grad()
    def behaviour_policy(self, batch: TextBatch, micro_batch_size: int) -> BehaviourPolicy:
        """The old policy's log-probs; under `routing_replay=r2` its routes are recorded into
        `batch.old_routes` for the update to replay."""
        parts, routes = [], []
        routing = self.model.routing if self.options.routing_replay == "r2" else None
        for start in range(0, len(batch), micro_batch_size):
            micro = batch.select(range(start, min(start + micro_batch_size, len(batch))))
            if routing is None:
                parts.append(self.log_probs(micro).cpu())
                continue
            routing.set_replay(None)
            with routing.recording() as layers:
                parts.append(self.model.token_log_probs(
                    micro.sequences, micro.attention_mask, micro.prompt_width, micro.temperature,
                    collate_media(micro.media)).cpu())
                routes.append(take_recorded(layers, len(micro)).to(routing.layout.dtype).cpu())
        if routes:
            batch.old_routes = torch.cat(routes)
        return BehaviourPolicy(torch.cat(parts), batch.response_mask, routes=batch.old_routes if routes else None)

    def loss(self, micro: TextBatch, chunk: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        full_vocab = bool(self.teachers) and self.options.distill_form == "full_vocab"
        if full_vocab:  # the student's logits, for the exact KL; the log-probs taken from them as token_log_probs does
            logits = response_logits(self.model, micro, collate_media(micro.media))
            targets = micro.sequences[:, micro.prompt_width:].to(logits.device)
            log_prob = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        else:
            logits, log_prob = None, self.log_probs(micro)
        device = log_prob.device
        algo = self.algo
        ref = None
        if algo.kl_coef > 0:
            with torch.no_grad(), self.model.reference_policy():
                ref = self.log_probs(micro)
        old_log_prob = micro.old_log_probs.to(device)
        mask = micro.response_mask.to(device)
        advantages, distill_loss, distill = micro.advantages.to(device)[:, None], None, {}
        if self.teachers:
            routes = [route(self.teacher_options, m) for m in micro.metadata]
            if None in routes:  # fit_prompts refused such prompts; a producer's own prompts reach here
                check_routes(self.teacher_options, [PromptItem(p, m) for p, m in zip(micro.prompts, micro.metadata)],
                             "the step's prompts")
            extra, distill_loss, per_sample, seconds = token_distill(
                self.teachers, routes, micro, log_prob, mask, self.options, logits)
            if extra is not None:
                advantages = advantages + extra
            distill = {"distill/kl": per_sample.mean(), "timing/teacher": torch.tensor(seconds)}
            index = torch.as_tensor(routes, device=per_sample.device)
            for k, teacher in enumerate(self.teachers):
                if bool((index == k).any()):
                    distill[f"distill/{teacher.name}/kl"] = per_sample[index == k].mean()
        loss, metrics = self.policy_loss(
            TokenLossInput(
                log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, mask=mask,
                ref_log_prob=ref,
                rollout_is_weight=None if micro.rollout_is_weights is None else micro.rollout_is_weights.to(device),
            )
        )
        metrics = {("loss/policy" if k == "policy_loss" else f"loss/{k}"): v for k, v in metrics.items()}
        metrics.update(token_gap_metrics(log_prob, old_log_prob, mask))
        if distill_loss is not None:
            loss = loss + distill_loss
        metrics.update(distill)
        metrics["loss/total"] = loss.detach()
        return loss, metrics


def build_token_loss(loss_cls: type[TokenLoss], options, sampling: TokenSampling, kl_coef: float) -> TokenLoss:
    """A token loss from its bound options (the text family's response loss, the think-draw
    family's plan loss). seq-mean-token-sum-norm's constant left null is Dr.GRPO's response
    length budget, the family's `sampling.max_new_tokens` (`rollout.sampling_options.max_new_tokens`)."""
    if isinstance(options, AggregatedTokenOptions) and options.loss_agg_mode == SUM_NORM_MODE and options.loss_scale_factor is None:
        options = dataclasses.replace(options, loss_scale_factor=float(sampling.max_new_tokens))
    return loss_cls(options, kl_coef=kl_coef)


def token_gap_metrics(log_prob: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gap over the counted tokens (`update.GAP_*_KEY`): how far the stored old log-probs are
    from this forward's (none when no token counts)."""
    gap = (log_prob.detach() - old_log_prob)[mask.bool()].abs()
    if not gap.numel():
        return {}
    return {GAP_MAX_KEY: gap.max(), GAP_MEAN_KEY: gap.mean()}

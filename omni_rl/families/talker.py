"""The talker family: an omni model's spoken answer, trained as a trajectory of speech frames.

A sample is the thinker's answer, then the frames the talker speaks it in (`SpeechModelBase`);
a frame of K codec tokens is one action whose log-prob is their sum, so every token loss applies
unchanged (docs/models.md says why). With `model.stage=thinker_talker` the answer's tokens come
first in the same trajectory. The driver samples the answers with the text engine, speaks them
in one padded batch and decodes them for the rewards (`metadata["spoken_text"]`); the update
teacher-forces the frames with `speech_log_probs`.

Not here (refused at load): Ray workers, pipelined rollouts, other engines, a KL term, rollout
correction, top-k / top-p / repetition penalty.
"""
from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path

import torch

from omni_rl.algos.token_losses import TOKEN_LOSSES, TokenLossInput
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.data.prompts import PromptItem
from omni_rl.data.speech_batch import SpeechBatch, answer_ids_of, prompt_ids_of
from omni_rl.data.text_batch import TextBatch
from omni_rl.families.autoregressive import TextFamily, TextOptions, build_token_loss, token_gap_metrics
from omni_rl.families.sampling import TalkerSampling, TokenSampling
from omni_rl.families.base import BehaviourPolicy, ModelFamily, register_family
from omni_rl.models.speech import SpeechModelBase
from omni_rl.reward.media import MediaSamples
from omni_rl.utils.atomic import atomic_write_bytes, atomic_write_text
from omni_rl.utils.audio import wav_bytes
from omni_rl.utils.seeding import derive_seed

__all__ = ["TalkerFamily"]


@register_family("talker")
class TalkerFamily(ModelFamily):
    batch_type = SpeechBatch
    sample_modalities = frozenset({"audio"})  # a MediaSamples of the spoken answers
    rollout_is_levels = ()
    losses = TOKEN_LOSSES
    Options = TextOptions  # the answer's prompt limits; how it is spoken is `Sampling`'s
    Sampling = TalkerSampling

    def __init__(self, cfg: OmniConfig, model: SpeechModelBase, options=None, trains: bool = True):
        super().__init__(cfg, model, options, trains)
        self.answer = TextFamily(cfg, model, self.options, trains=False)

    def build_policy_loss(self):
        # seq-mean-token-sum-norm's constant defaults to the trajectory's budget of actions.
        sampling = self.cfg.rollout.sampling_options
        budget = sampling.max_frames + (sampling.max_new_tokens if self.model.trains_thinker else 0)
        return build_token_loss(self.loss_class, self.loss_options(), TokenSampling(max_new_tokens=budget),
                                self.cfg.algo.kl_coef)

    @classmethod
    def check_config(cls, cfg: OmniConfig) -> None:
        t, r = cfg.trainer, cfg.rollout
        why = "the talker speaks with the driver's model, which must be the trained one"
        if t.backend != "local":
            raise ConfigError(f"trainer.backend={t.backend!r}: expected local for a talker stage ({why})")
        if t.pipeline != "on_policy":
            raise ConfigError(f"trainer.pipeline={t.pipeline!r}: expected on_policy for a talker stage ({why}, "
                              f"never ahead of the update)")
        if r.backend != "native":
            raise ConfigError(f"rollout.backend={r.backend!r}: expected native for a talker stage ({why}; the "
                              f"answer's text engine runs in this process too)")
        if cfg.algo.kl_coef != 0:
            raise ConfigError(f"algo.kl_coef={cfg.algo.kl_coef!r}: expected 0 for a talker stage (no KL term to a "
                              f"reference talker yet)")
        level = cfg.algo.rollout_correction_options.level
        if level != "none":
            raise ConfigError(f"algo.rollout_correction_options.level={level!r}: expected none for a talker stage (its "
                              f"engine is the trainer's own model, so there is nothing to correct)")

    # --- the rollout half -----------------------------------------------------------------
    def fit_prompts(self, items: list, what: str = "data.prompts") -> list:
        return self.answer.fit_prompts(items, what)

    def speech_seed(self, request_seed: int) -> int:
        """An utterance's sampling seed: drawn from its answer's request seed alone."""
        return derive_seed(request_seed >> 32, "speech", request_seed)

    def _answers(self, engine, requests, prompts, metadata, groups) -> TextBatch:
        results = engine.generate(requests)
        return TextBatch.from_results(results, prompts, metadata, groups, self.model.pad_token_id)

    def _speak(self, text: TextBatch, seeds: list[int], temperature: float, max_frames: int) -> SpeechBatch:
        """The batch of `text`'s answers spoken (and decoded) in at most `max_frames` frames each;
        each sample's metadata gains the text it was asked to speak, `spoken_text`."""
        speech = self.model.sample_speech(prompt_ids_of(text), answer_ids_of(text), seeds, max_frames, temperature)
        text.metadata = [{**m, "spoken_text": t} for m, t in zip(text.metadata, text.texts)]
        return SpeechBatch(
            text=text, codes=speech.codes, frame_mask=speech.frame_mask, speech_rollout_log_probs=speech.log_probs,
            speech_temperature=temperature, audio=self.model.decode_speech(speech.codes, speech.frame_mask),
            sample_rate=self.model.sample_rate, speech_finish_reasons=speech.finish_reasons,
            trains_thinker=self.model.trains_thinker, prefix_width=speech.prefix_width,
        )

    def answer_and_speak(self, engine, requests, prompts: list[str], metadata: list[dict], groups: list[int],
                         temperature: float, max_frames: int) -> SpeechBatch:
        """The answers to `requests` (the text engine's), spoken at `temperature` (0: greedy) in at
        most `max_frames` frames, each utterance from its request's speech seed; what rollout,
        validation and evaluation (at its protocol's values) draw."""
        text = self._answers(engine, requests, prompts, metadata, groups)
        return self._speak(text, [self.speech_seed(r.seed) for r in requests], temperature, max_frames)

    def rollout(self, engine, prompts: list[PromptItem], step: int, score=None) -> tuple[SpeechBatch, list]:
        n = self.cfg.trainer.samples_per_prompt
        requests, texts, metadata, groups = [], [], [], []
        for g, item in enumerate(prompts):
            for k in range(n):
                requests.append(self.answer.request(item, derive_seed(self.cfg.trainer.seed, "train", step, g * n + k)))
                texts.append(item.prompt)
                metadata.append(item.metadata)
                groups.append(g)
        sampling = self.cfg.rollout.sampling_options
        batch = self.answer_and_speak(engine, requests, texts, metadata, groups, sampling.speech_temperature,
                                      sampling.max_frames)
        futures = []
        if score is not None:  # every utterance is done now: hand each to the scorer
            for i in range(len(batch)):
                futures.append(Future())
                score(MediaSamples(audio=[batch.audio[i]], sample_rate=batch.sample_rate), batch.prompts[i],
                      batch.metadata[i], futures[-1])
        return batch, futures

    def reward_inputs(self, batch: SpeechBatch):
        return MediaSamples(audio=list(batch.audio), sample_rate=batch.sample_rate), batch.prompts, batch.metadata

    def rollout_metrics(self, batch: SpeechBatch) -> dict[str, float]:
        frames = batch.frame_mask.sum(1)
        return {
            **self.answer.rollout_metrics(batch.text),
            "response/speech_frames_mean": float(frames.mean()),
            "response/speech_seconds_mean": sum(len(a) for a in batch.audio) / len(batch) / batch.sample_rate,
            # Utterances cut at rollout.sampling_options.max_frames before the end-of-speech token.
            "response/speech_clip_ratio": sum(f == "length" for f in batch.speech_finish_reasons) / len(batch),
        }

    @torch.no_grad()
    def validate(self, engine, items: list[PromptItem], step: int, rewards, output_dir: Path, logger) -> dict[str, float]:
        """Answers sampled as configured from fixed seeds, spoken greedily (temperature 0); each
        sample's WAV, spoken text and rewards written under samples/val_step_NNNNNN/."""
        t = self.cfg.trainer
        requests, texts, metadata, groups = [], [], [], []
        for g, item in enumerate(items):
            for k in range(t.val_samples_per_prompt):
                requests.append(self.answer.request(item, derive_seed(t.val_seed, "val", g, k)))
                texts.append(item.prompt)
                metadata.append(item.metadata)
                groups.append(g)
        if not requests:
            return {}
        batch = self.answer_and_speak(engine, requests, texts, metadata, groups, 0.0,
                                      self.cfg.rollout.sampling_options.max_frames)
        reward = rewards.score(*self.reward_inputs(batch))
        folder = output_dir / "samples" / f"val_step_{step:06d}"
        lines = []
        for i, (clip, score) in enumerate(zip(batch.audio, reward.total.tolist())):
            name = f"{i:03d}.wav"
            atomic_write_bytes(folder / name, wav_bytes(clip, batch.sample_rate))
            lines.append(json.dumps({"wav": name, "prompt": batch.prompts[i], "spoken_text": batch.text.texts[i],
                                     "frames": int(batch.frame_mask[i].sum()), "reward": score}, ensure_ascii=False))
            if logger is not None:
                logger.log_audio(f"val/audio/{i}", clip[None], batch.sample_rate, step)
        atomic_write_text(folder / "samples.jsonl", "\n".join(lines) + "\n")
        return {f"val/{k}": v for k, v in reward.metrics.items()}

    # --- the actor half -------------------------------------------------------------------
    def num_chunks(self, batch: SpeechBatch) -> int:
        return 1  # one backward per micro-batch: the whole trajectory at once

    def log_probs(self, batch: SpeechBatch) -> torch.Tensor:
        """[N, F] (or [N, R + F] with the answer's tokens first) under the current weights."""
        speech = self.model.speech_log_probs(batch.prompt_ids(), batch.answer_ids(), batch.codes, batch.frame_mask,
                                             batch.speech_temperature, batch.prefix_width)
        if not batch.trains_thinker:
            return speech
        answer = self.answer.log_probs(batch.text)
        return torch.cat([answer, speech.to(answer.device)], dim=1)

    @torch.no_grad()
    def behaviour_policy(self, batch: SpeechBatch, micro_batch_size: int) -> BehaviourPolicy:
        parts = []
        for start in range(0, len(batch), micro_batch_size):
            micro = batch.select(range(start, min(start + micro_batch_size, len(batch))))
            parts.append(self.log_probs(micro).float().cpu())
        return BehaviourPolicy(torch.cat(parts), batch.action_mask())

    def loss(self, micro: SpeechBatch, chunk: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        log_prob = self.log_probs(micro).float()
        device = log_prob.device
        old_log_prob = micro.old_log_probs.to(device)
        mask = micro.action_mask().to(device)
        loss, metrics = self.policy_loss(
            TokenLossInput(log_prob=log_prob, old_log_prob=old_log_prob, advantages=micro.advantages.to(device)[:, None],
                           mask=mask)
        )
        metrics = {("loss/policy" if k == "policy_loss" else f"loss/{k}"): v for k, v in metrics.items()}
        metrics.update(token_gap_metrics(log_prob, old_log_prob, mask))
        metrics["loss/total"] = loss.detach()
        return loss, metrics

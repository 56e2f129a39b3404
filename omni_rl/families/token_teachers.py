"""Frozen teachers of the text family: they score the student's own responses token by token.

The teachers' blocks are `omni_rl.families.teachers.TeacherOptions` (name, path, data_source, ...),
set under `algo.family_options.teachers` of the text family, with `distill_coef` and
`distill_form` (`TokenDistillOptions`). The teacher scores the same prompt and response token
ids as the student, so it must read them the same way: its tokenizer's vocabulary must equal the
student's (one error line at load otherwise, whichever form). A teacher without `path` is the
student's own base (LoRA disabled, no second copy); another is built beside the student, frozen
(once for all the teachers of one checkpoint).

Forms (`omni_rl.algos.distill` has the maths):
- `reward`: each response token's advantage gains distill_coef x (log pi_T - log pi_S), so with a
  reward of weight 0 the run is pure on-policy distillation;
- `direct`: the loss gains distill_coef x mean_t sg(k1_t) log pi_S(y_t);
- `full_vocab`: the loss gains distill_coef x the exact per-token KL over the vocabulary, computed
  in chunks of `distill_chunk_size` positions (it needs the student's logits: one more forward).

Not here: LoRA teachers and guidance for text (refused at load), re-tokenising for a teacher of
another tokenizer.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Optional

import torch

from omni_rl.algos.distill import direct_distill_loss, distill_advantages, full_vocab_reverse_kl, token_reverse_kl
from omni_rl.option import ComponentOptions, option
from omni_rl.families.teachers import (TeacherConfigError, TeacherOptions, TeacherOutputError, architecture_of,
                                      check_teachers)
from omni_rl.models.factory import build_model
from omni_rl.rollout.text_sampling import collate_media

FORMS = ("reward", "direct", "full_vocab")


@dataclass
class TokenDistillOptions(ComponentOptions):
    """The text family's distillation options (`algo.family_options`)."""

    teachers: list[TeacherOptions] = option([], "On-policy distillation: frozen teachers that score the student's responses "
                                      "(blocks of omni_rl.families.teachers.TeacherOptions: name, path, data_source, "
                                      "metadata_key).")
    distill_coef: float = option(0.0, "The weight of the teachers' term (> 0 with teachers).")
    distill_form: str = option("reward", "reward (-k1 added to each token's advantage), direct (a loss whose gradient "
                                         "estimates the reverse KL's) or full_vocab (the exact KL over the vocabulary).")
    distill_chunk_size: int = option(1024, "full_vocab: positions per chunk of the exact KL.")

    def check(self) -> None:
        if self.distill_form not in FORMS:
            raise ValueError(f"distill_form={self.distill_form!r}: expected one of {', '.join(FORMS)}")
        if not (isinstance(self.distill_chunk_size, int) and self.distill_chunk_size >= 1):
            raise ValueError(f"distill_chunk_size={self.distill_chunk_size!r}: expected an integer >= 1")
        if not self.distill_coef >= 0:
            raise ValueError(f"distill_coef={self.distill_coef!r}: expected >= 0")
        teachers = check_teachers(self.teachers)
        if teachers and self.distill_coef == 0:
            raise ValueError("teachers: unused with distill_coef=0; set distill_coef > 0")
        if self.distill_coef > 0 and not teachers:
            raise ValueError(f"distill_coef={self.distill_coef!r}: expected 0 without teachers (nothing to distil from)")
        for i, t in enumerate(teachers):
            if t.lora is not None or t.guidance_scale is not None:
                raise ValueError(f"teachers[{i}] ({t.name}): lora and guidance_scale are for diffusion teachers; a text "
                                 f"teacher is a model path (or the student's own base)")


class TokenTeacher:
    """A frozen language model that scores response tokens (the student's own when `shares_student`)."""

    def __init__(self, options: TeacherOptions, model, shares_student: bool):
        self.options, self.name, self.model, self.shares_student = options, options.name, model, shares_student

    def _context(self):
        import contextlib

        return self.model.reference_policy() if self.shares_student else contextlib.nullcontext()

    @torch.no_grad()
    def log_probs(self, micro, media) -> torch.Tensor:
        with self._context():
            return self.model.token_log_probs(micro.sequences, micro.attention_mask, micro.prompt_width,
                                              micro.temperature, media)

    @torch.no_grad()
    def logits(self, micro, media) -> torch.Tensor:
        with self._context():
            return response_logits(self.model, micro, media)


def response_logits(model, micro, media) -> torch.Tensor:
    """Tempered logits [B, T_response, V] at the positions that predict the response tokens, as
    `token_log_probs` computes them."""
    keep = micro.sequences.shape[1] - micro.prompt_width + 1
    logits, _ = model.forward_logits(micro.sequences, micro.attention_mask, media, logits_to_keep=keep)
    return logits[:, :-1] / micro.temperature


def build_token_teachers(cfg, student, blocks: list[TeacherOptions],
                         key: str = "algo.family_options.teachers") -> list[TokenTeacher]:
    teachers = []
    built: dict[tuple[str, Optional[str]], object] = {}  # teachers of one checkpoint share its one copy
    for i, t in enumerate(blocks):
        where = f"{key}[{i}]"
        if t.path is None and cfg.model.lora.enabled:
            teachers.append(TokenTeacher(t, student, shares_student=True))
            continue
        path = cfg.model.path if t.path is None else t.path
        revision = t.revision if t.path is not None else cfg.model.revision
        if (path, revision) in built:
            teachers.append(TokenTeacher(t, built[path, revision], shares_student=False))
            continue
        mine, theirs = architecture_of(cfg.model.path, cfg.model.revision, "model.path"), architecture_of(
            path, revision, f"{where}.path")
        if mine != theirs:
            raise TeacherConfigError(f"{where}.path={path!r} is a {theirs}, the student ({cfg.model.path!r}) a {mine}; "
                                     f"a teacher must be of the student's family (its architecture)")
        model_cfg = dataclasses.replace(cfg.model, path=path, revision=revision,
                                        lora=dataclasses.replace(cfg.model.lora, enabled=False))
        with torch.random.fork_rng(devices=[]):
            model = build_model(model_cfg, student.device, tuple(cfg.plugins))
        if model.tokenizer.get_vocab() != student.tokenizer.get_vocab():
            raise TeacherConfigError(f"{where}.path={path!r}: its tokenizer's vocabulary differs from the student's "
                                     f"({len(model.tokenizer.get_vocab())} and {len(student.tokenizer.get_vocab())} "
                                     f"tokens); a text teacher scores the student's token ids, so it needs the same "
                                     f"tokenizer")
        for module in model.trainable_modules().values():
            module.requires_grad_(False)
        model.set_eval_mode()
        built[path, revision] = model
        teachers.append(TokenTeacher(t, model, shares_student=False))
    return teachers


def token_distill(teachers: list[TokenTeacher], routes: list[int], micro, log_prob: torch.Tensor,
                  mask: torch.Tensor, options: TokenDistillOptions, student_logits: Optional[torch.Tensor]):
    """The teachers' term for a micro-batch: (advantage to add [B, T] or None, loss to add or None,
    per-sample KL [B] for the metrics, seconds of teacher forwards)."""
    start = time.perf_counter()
    full = options.distill_form == "full_vocab"
    scores = torch.empty_like(student_logits if full else log_prob, dtype=torch.float32)
    for k, teacher in enumerate(teachers):
        rows = [i for i, r in enumerate(routes) if r == k]
        if not rows:
            continue
        sub = micro.select(rows) if len(rows) < len(routes) else micro
        media = collate_media(sub.media)
        out = teacher.logits(sub, media) if full else teacher.log_probs(sub, media)
        # Checked like a reward's output: a teacher's failure stops the run with its name.
        if out.shape[1:] != scores.shape[1:]:
            raise TeacherOutputError(f"teacher {teacher.name!r}: its scores have shape {tuple(out.shape)}, the student's "
                                     f"{tuple(scores.shape)}; a text teacher must score the student's token ids")
        finite = torch.isfinite(out.reshape(out.shape[0], -1)).all(dim=1)
        if not bool(finite.all()):
            i = rows[int((~finite).nonzero()[0])]
            raise TeacherOutputError(f"teacher {teacher.name!r}: its scores of sample {i} ({micro.prompts[i][:40]!r}) are "
                                     f"not finite; check the teacher's weights and dtype")
        scores[torch.as_tensor(rows, device=scores.device)] = out.to(scores.device, torch.float32)
    seconds = time.perf_counter() - start
    m = mask.to(torch.float32)
    count = m.sum(dim=1).clamp(min=1.0)
    if full:
        kl_t = full_vocab_reverse_kl(student_logits, scores, options.distill_chunk_size)
        per_sample = (kl_t.detach() * m).sum(dim=1) / count
        return None, options.distill_coef * (kl_t * m).sum() / m.sum().clamp(min=1.0), per_sample, seconds
    per_sample = (token_reverse_kl(log_prob, scores) * m).sum(dim=1) / count
    if options.distill_form == "reward":
        return options.distill_coef * distill_advantages(log_prob, scores, mask), None, per_sample, seconds
    loss, _ = direct_distill_loss(log_prob, scores, mask)
    return None, options.distill_coef * loss, per_sample, seconds

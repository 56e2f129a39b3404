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

Placement (`placement`): colocated (beside the student; on FSDP2 ranks sharded like the actor) or a
pool of Ray actors of its own (`PooledTokenTeacher`; `omni_rl.families.teachers` says how).

Not here: LoRA teachers and guidance for text (refused at load), re-tokenising for a teacher of
another tokenizer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from omni_rl.algos.distill import direct_distill_loss, distill_advantages, full_vocab_reverse_kl, token_reverse_kl
from omni_rl.option import ComponentOptions, option
from omni_rl.families.teachers import (PoolClient, TeacherConfigError, TeacherOptions, TeacherOutputError,
                                      build_frozen, check_architecture, check_teachers, pool_actors, shard_teacher,
                                      shards_teachers, teacher_source)
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
        self.sharded = False  # sharded with FSDP2 across the Ray ranks: its forward is a collective

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


class PooledTokenTeacher:
    """A text teacher on Ray actors of its own (`placement: pool`), with `TokenTeacher`'s
    interface: a micro-batch's token ids (and media) go to the actors on the host, its rows split
    among them; the scores come back to the student's device, checked there like a colocated one's."""

    shares_student = False
    sharded = False

    def __init__(self, options: TeacherOptions, device: torch.device, actors: list):
        self.options, self.name, self.device = options, options.name, device
        self.pool = PoolClient(options, actors)

    def vocab(self) -> dict:
        return self.pool.get([self.pool.actors[0].vocab.remote()], "read its tokenizer")[0]

    def _scores(self, method: str, micro) -> torch.Tensor:
        def args(lo, hi):
            sub = micro.select(list(range(lo, hi)))
            return (sub.sequences.cpu(), sub.attention_mask.cpu(), micro.prompt_width, micro.temperature,
                    {k: v.cpu() for k, v in collate_media(sub.media).items()})

        return torch.cat(self.pool.scatter(method, len(micro.prompts), args)).to(self.device)

    def log_probs(self, micro, media) -> torch.Tensor:
        return self._scores("log_probs", micro)

    def logits(self, micro, media) -> torch.Tensor:
        return self._scores("logits", micro)


def response_logits(model, micro, media) -> torch.Tensor:
    """Tempered logits [B, T_response, V] at the positions that predict the response tokens, as
    `token_log_probs` computes them."""
    keep = micro.sequences.shape[1] - micro.prompt_width + 1
    logits, _ = model.forward_logits(micro.sequences, micro.attention_mask, media, logits_to_keep=keep)
    return logits[:, :-1] / micro.temperature


def build_token_teachers(cfg, student, blocks: list[TeacherOptions],
                         key: str = "algo.family_options.teachers") -> list:
    teachers: list = []
    built: dict[tuple[str, Optional[str]], object] = {}  # teachers of one checkpoint share its one copy
    for i, t in enumerate(blocks):
        where = f"{key}[{i}]"
        if t.pooled:
            if t.path is not None:
                check_architecture(cfg, t.path, t.revision, f"{where}.path")
            pooled = PooledTokenTeacher(t, student.device, pool_actors(cfg, t))
            _check_vocab(pooled.vocab(), student, teacher_source(cfg, t)[0], where)
            teachers.append(pooled)
            continue
        if t.path is None and cfg.model.lora.enabled:
            teachers.append(TokenTeacher(t, student, shares_student=True))
            continue
        source = teacher_source(cfg, t)
        if source not in built:
            check_architecture(cfg, *source, f"{where}.path")
            model = build_frozen(cfg, *source, student.device)
            _check_vocab(model.tokenizer.get_vocab(), student, source[0], where)
            built[source] = model
        teachers.append(TokenTeacher(t, built[source], shares_student=False))
    if shards_teachers(cfg):
        for model in built.values():
            shard_teacher(model)
        for teacher in teachers:
            # (the student's own base is sharded by the engine: its forward is a collective too)
            teacher.sharded = isinstance(teacher, TokenTeacher)
    return teachers


def _check_vocab(vocab: dict, student, path: str, where: str) -> None:
    mine = student.tokenizer.get_vocab()
    if vocab != mine:
        raise TeacherConfigError(f"{where}.path={path!r}: its tokenizer's vocabulary differs from the student's "
                                 f"({len(vocab)} and {len(mine)} tokens); a text teacher scores the student's token "
                                 f"ids, so it needs the same tokenizer")


def token_distill(teachers: list[TokenTeacher], routes: list[int], micro, log_prob: torch.Tensor,
                  mask: torch.Tensor, options: TokenDistillOptions, student_logits: Optional[torch.Tensor]):
    """The teachers' term for a micro-batch: (advantage to add [B, T] or None, loss to add or None,
    per-sample KL [B] for the metrics, seconds of teacher forwards)."""
    start = time.perf_counter()
    full = options.distill_form == "full_vocab"
    scores = torch.empty_like(student_logits if full else log_prob, dtype=torch.float32)
    for k, teacher in enumerate(teachers):
        rows = [i for i, r in enumerate(routes) if r == k]
        if teacher.sharded:
            # Its forward all-gathers across the ranks, whose micro-batches route differently:
            # it runs on every micro-batch, on all of it, in step with the others; its rows are kept.
            media = collate_media(micro.media)
            whole = teacher.logits(micro, media) if full else teacher.log_probs(micro, media)
            if not rows:
                continue
            out = whole[torch.as_tensor(rows, device=whole.device)]
        elif not rows:
            continue
        else:
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

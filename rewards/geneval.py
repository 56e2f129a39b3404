"""`geneval`: GenEval's rules as a reward, on a COCO Mask2Former and a CLIP colour classifier.

Each sample's metadata is its GenEval row (`tag`, `include`, `exclude`). The detector
(`geneval_detector.Mask2FormerDetector`) finds the instances, `omni_rl.eval.geneval_rules` keeps
them and asks for the colours it reads (CLIP zero-shot on masked crops), and `verdict` scores.
`score`: "partial" (Flow-GRPO's partial credit, default), "strict" or "correct" (GenEval's); each
sample falls in the group `geneval_task/<tag>` with its verdicts as details, so both accuracies
are logged per task. Options: `model`, `processor`, `clip_model`, `clip_processor`, `score`, the
protocol's constants (`threshold`, `counting_threshold`, `max_objects`, `max_overlap`,
`position_threshold`), `device`. The detector's weights are not GenEval's mmdet checkpoint, so
numbers are not directly comparable with mmdet-scored leaderboards (docs/evaluation.md).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from omni_rl.eval.geneval_rules import (
    COCO_CLASSES, GenEvalProtocol, Verdict, kept_objects, needs_colour, parse_row, verdict,
)
from omni_rl.reward import Images, RewardInputError, RewardScores, check_batch, register_reward, to_pil_list
from rewards.clip_embedder import DEFAULT_CLIP, ClipEmbedder
from rewards.geneval_detector import DEFAULT_DETECTOR, ColourClassifier, Mask2FormerDetector

SCORES = ("partial", "strict", "correct")
GROUP = "geneval_task"


def _protocol(threshold: float, counting_threshold: float, max_objects: int, max_overlap: float,
              position_threshold: float) -> GenEvalProtocol:
    return GenEvalProtocol(threshold=threshold, counting_threshold=counting_threshold, max_objects=max_objects,
                           max_overlap=max_overlap, position_threshold=position_threshold)


def _check_options(*, score: str = "partial", threshold: float = 0.3, counting_threshold: float = 0.9,
                   max_objects: int = 16, max_overlap: float = 1.0, position_threshold: float = 0.1,
                   **_: Any) -> None:
    if score not in SCORES:
        raise ValueError(f"score={score!r}; expected one of {', '.join(SCORES)} (partial: Flow-GRPO's training reward)")
    _protocol(threshold, counting_threshold, max_objects, max_overlap, position_threshold)


def check_rows(prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> None:
    """Each sample's metadata is a GenEval row over COCO's classes; a RewardInputError naming it otherwise."""
    for i, (prompt, meta) in enumerate(zip(prompts, metadata)):
        where = f"geneval: sample {i} (prompt {prompt!r:.60})"
        try:
            row = parse_row(meta, where=where)
        except ValueError as err:
            raise RewardInputError(f"{err}; its metadata must hold the row's tag, include and exclude keys, "
                                   f"as GenEval's metadata jsonl rows do") from None
        unknown = sorted({c.name for c in row.include + row.exclude} - set(COCO_CLASSES))
        if unknown:
            raise RewardInputError(f"{where}: classes {unknown} are not among the detector's 80 COCO classes "
                                   f"(GenEval's object_names.txt names them, e.g. 'dining table', 'tv remote')")


class GenEvalScorer:
    def __init__(self, model: str, processor: str | None, clip_model: str, clip_processor: str | None, score: str,
                 rules: GenEvalProtocol, device: str):
        self.score, self.rules = score, rules
        self.detector = Mask2FormerDetector(model, processor, device, "geneval",
                                            min(rules.threshold, rules.counting_threshold))
        self.colours = ColourClassifier(ClipEmbedder("geneval", clip_model, clip_processor, device))

    def verdicts(self, images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[Verdict]:
        check_batch(images, prompts, metadata)
        check_rows(prompts, metadata)
        pils = to_pil_list(images)
        out = []
        for image, detections, meta in zip(pils, self.detector(pils), metadata):
            row = parse_row(meta)
            kept = {name: list(objects) for name, objects in kept_objects(detections, row, self.rules).items()}
            wanted: dict[str, list[int]] = {}
            for name, index in needs_colour(kept, row):
                wanted.setdefault(name, []).append(index)
            for name, indices in wanted.items():
                colours = self.colours(image, [kept[name][i] for i in indices], name)
                for i, colour in zip(indices, colours):
                    kept[name][i] = dataclasses.replace(kept[name][i], colour=colour)
            out.append(verdict(kept, row, self.rules))
        return out

    def __call__(self, images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> RewardScores:
        verdicts = self.verdicts(images, prompts, metadata)
        value = {"partial": lambda v: v.score, "strict": lambda v: float(v.strict_correct),
                 "correct": lambda v: float(v.correct)}[self.score]
        return RewardScores(
            scores=[value(v) for v in verdicts],
            groups=[f"{GROUP}/{meta['tag']}" for meta in metadata],
            details=[{"correct": v.correct, "strict_correct": v.strict_correct, "score": v.score,
                      "reason": v.reason, "strict_reason": v.strict_reason} for v in verdicts],
        )


@register_reward("geneval", modalities={"image"}, check_options=_check_options, needs_metadata={"tag", "include"},
                 check_prompts=check_rows)
def geneval(
    *, model: str = DEFAULT_DETECTOR, processor: str | None = None, clip_model: str = DEFAULT_CLIP,
    clip_processor: str | None = None, score: str = "partial", threshold: float = 0.3,
    counting_threshold: float = 0.9, max_objects: int = 16, max_overlap: float = 1.0, position_threshold: float = 0.1,
    device: str = "auto",
) -> GenEvalScorer:
    """GenEval's rules on each image for its metadata row (module docstring)."""
    _check_options(score=score)
    rules = _protocol(threshold, counting_threshold, max_objects, max_overlap, position_threshold)
    return GenEvalScorer(model, processor, clip_model, clip_processor, score, rules, device)

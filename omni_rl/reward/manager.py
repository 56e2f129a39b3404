"""The reward manager: runs the configured rewards on a batch and combines them.

    manager = RewardManager([RewardSpec("jpeg_compressibility", weight=1.0, kwargs={"scale": 0.002}),
                             RewardSpec("brightness", weight=0.5, required=False)])
    out = manager.score(samples, prompts, metadata)   # out.total [B], out.per_reward, out.metrics

A failing or absurd score stops the run naming its reward, never a silent 0; an optional reward
is left out of that batch with the other weights rescaled. Left out: micro-batching, async or
remote rewards, caching (they wrap a scorer).
"""
from __future__ import annotations

import logging
import math
import numbers
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import torch

from omni_rl.errors import OmniRunError
from omni_rl.plugins import load_plugins
from omni_rl.reward.inputs import RewardInputError, Samples, batch_size, check_batch, check_prompts_metadata, sample_kind
from omni_rl.reward.media import AUDIO, VIDEO, MediaSamples
from omni_rl.reward.registry import RewardConfigError, Scorer, build_reward, reward_endpoint, reward_modalities
from omni_rl.reward.scores import RewardScores, check_details, check_groups, detail_pairs, group_means

logger = logging.getLogger(__name__)

_TOTAL = "total"

# The largest |weight * score| and |total| passed on to the advantage: a larger one stops the run, naming its reward.
MAX_ABS_REWARD = 1e15


class RewardError(OmniRunError):
    """A reward failed while scoring a batch (raised, wrong number of scores, NaN/inf)."""


@dataclass
class RewardSpec:
    """One entry of the reward list.

    name:     the registered reward name (see `omni_rl.reward.REWARDS.names()`).
    weight:   multiplies the reward's raw score in the total; any finite float (0 = log only).
    required: if False, a failure on a batch is logged and the reward is left out of that
              batch's total (the other weights rescaled); if True, a failure raises.
    kwargs:   options passed to the reward's factory, e.g. {"scale": 0.002}.
    video_frames: for an image reward on video: score this many evenly spaced frames of each
              video and average them (None: the reward is not given video).
    """

    name: str
    weight: float = 1.0
    required: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)
    video_frames: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise RewardConfigError(f"reward name must be a non-empty string, got {self.name!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, numbers.Real):
            raise RewardConfigError(
                f"reward {self.name!r}: weight {self.weight!r} has type {type(self.weight).__name__}; "
                f"expected a finite float"
            )
        if not math.isfinite(self.weight):
            raise RewardConfigError(
                f"reward {self.name!r}: weight is {self.weight}; expected a finite float "
                f"(use required=False or drop the reward instead of an infinite/NaN weight)"
            )
        self.weight = float(self.weight)
        if not isinstance(self.required, bool):
            raise RewardConfigError(
                f"reward {self.name!r}: required={self.required!r}; expected True or False"
            )
        if not isinstance(self.kwargs, Mapping):
            raise RewardConfigError(
                f"reward {self.name!r}: kwargs has type {type(self.kwargs).__name__}; expected a "
                f"mapping of option names to values, e.g. {{'scale': 0.002}}"
            )
        self.kwargs = dict(self.kwargs)
        k = self.video_frames
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1):
            raise RewardConfigError(
                f"reward {self.name!r}: video_frames={k!r}; expected an int >= 1 (frames of each video to "
                f"score as images), or None"
            )


@dataclass
class RewardOutput:
    """The rewards of one batch of B samples.

    total:      float32 [B], the weighted sum of the rewards that succeeded (rescaled if one failed)
    per_reward: name -> raw scores [B]; failed optional rewards are absent
    metrics:    `reward/<name>/mean|std|failed`, `reward/total/mean|std`, `reward/<group>`
    failed:     the optional rewards that failed on this batch
    groups, details: name -> [B] group keys / per-sample details, for rewards returning `RewardScores`
    """

    total: torch.Tensor
    per_reward: dict[str, torch.Tensor]
    metrics: dict[str, float]
    failed: list[str] = field(default_factory=list)
    groups: dict[str, list[Optional[str]]] = field(default_factory=dict)
    details: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


class RewardManager:
    """Builds every reward of `specs` once, then scores batches with them.

    `specs` holds `RewardSpec`s or mappings with the same keys (as read from a config).
    `plugins` names extra modules to import before building (a user's own reward modules);
    the `omni_rl.plugins` entry points are always loaded. `metrics_only`: the rewards are scored
    for the metrics alone (on-policy distillation's teachers supply the signal), so their weights
    may all be 0.
    """

    def __init__(self, specs: Iterable[RewardSpec | Mapping[str, Any]], *, plugins: Iterable[str] = (),
                 metrics_only: bool = False):
        specs = [_as_spec(spec, i) for i, spec in enumerate(specs)]
        if not specs:
            raise RewardConfigError(
                "the reward list is empty; configure at least one reward, e.g. "
                "[{name: jpeg_compressibility, weight: 1.0}]"
            )
        seen: set[str] = set()
        for spec in specs:
            if spec.name == _TOTAL:
                raise RewardConfigError(
                    f"a reward may not be named {_TOTAL!r}: the metrics reward/{_TOTAL}/* hold the "
                    f"weighted sum; register the reward under another name"
                )
            if spec.name in seen:
                raise RewardConfigError(
                    f"reward {spec.name!r} appears more than once in the reward list; each name may "
                    f"appear once (merge the entries and add their weights)"
                )
            seen.add(spec.name)
        if not metrics_only and all(spec.weight == 0.0 for spec in specs):
            raise RewardConfigError(
                f"every reward weight is 0 ({', '.join(s.name for s in specs)}), so the total would "
                f"always be 0; give at least one reward a non-zero weight (or distil from teachers: "
                f"algo.family_options.teachers)"
            )
        load_plugins(plugins)
        self.specs: tuple[RewardSpec, ...] = tuple(specs)
        self.modalities: dict[str, frozenset[str]] = {}
        for spec in specs:
            self.modalities[spec.name] = reward_modalities(spec.name, spec.kwargs)
            _check_video_frames(spec, self.modalities[spec.name])
        self._scorers: dict[str, Scorer] = {spec.name: build_reward(spec.name, **spec.kwargs) for spec in specs}
        # thread id -> (reward name, time.monotonic() at its start): what `running` reports.
        self._running: dict[int, tuple[str, float]] = {}
        self._running_lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.specs]

    def describe(self, name: str) -> str:
        """`'name'`, followed by `(url)` for a reward that declares an `endpoint` (the remote
        rewards `latent_http` and `http_scorer`), for messages that must say where a reward went."""
        spec = next((s for s in self.specs if s.name == name), None)
        url = None if spec is None else reward_endpoint(name, spec.kwargs)
        return repr(name) if url is None else f"{name!r} ({url})"

    def running(self) -> list[tuple[str, float]]:
        """The rewards scoring right now, as (`describe(name)`, seconds so far), one per thread
        inside `score`: what a caller that gave up waiting names in its message."""
        now = time.monotonic()
        with self._running_lock:
            items = list(self._running.values())
        return [(self.describe(name), now - start) for name, start in items]

    def close(self) -> None:
        """Nothing to stop: its rewards live in this process (`RayRewardManager` stops workers)."""

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{s.name}(w={s.weight:g}{'' if s.required else ', optional'})" for s in self.specs
        )
        return f"RewardManager([{parts}])"

    def score(
        self,
        samples: Samples | MediaSamples,
        prompts: Sequence[str],
        metadata: Sequence[dict[str, Any]] | None = None,
    ) -> RewardOutput:
        """Score B samples (images, texts, or a `MediaSamples`) with every reward.

        `metadata=None` means an empty dict per sample. Input errors (lengths, dtypes, a reward that
        cannot score these samples) raise `RewardInputError` before any reward runs.
        """
        media = isinstance(samples, MediaSamples)
        if metadata is None:
            metadata = [{} for _ in range(len(samples) if media else batch_size(samples))]
        if media:
            n, noun = len(samples), "samples"
            check_prompts_metadata(n, prompts, metadata, noun)
            plans = {spec.name: self._media_plan(i, spec, samples) for i, spec in enumerate(self.specs)}
        else:
            n = check_batch(samples, prompts, metadata)
            noun = sample_kind(samples)

        raw: dict[str, np.ndarray] = {}
        groups: dict[str, list[Optional[str]]] = {}
        details: dict[str, list[dict[str, Any]]] = {}
        errors: dict[str, RewardError] = {}
        frames: dict[int, Any] = {}  # k -> frames(k), shared by the rewards with the same k
        for spec in self.specs:
            try:
                if media and plans[spec.name] is not None:
                    k = plans[spec.name]
                    if k not in frames:
                        frames[k] = samples.frames(k)
                    repeated_prompts = [p for p in prompts for _ in range(k)]
                    repeated_metadata = [m for m in metadata for _ in range(k)]
                    per_frame, frame_groups, frame_details = self._run(
                        spec.name, frames[k], repeated_prompts, repeated_metadata, n * k, "frames"
                    )
                    scores = per_frame.reshape(n, k).mean(axis=1)
                    sample_groups = None if frame_groups is None else list(frame_groups[::k])
                    # A video's details are its frames' ({"frames": [...]}): no field is averaged for it.
                    sample_details = (None if frame_details is None else
                                      [{"frames": frame_details[i * k:(i + 1) * k]} for i in range(n)])
                else:
                    scores, sample_groups, sample_details = self._run(spec.name, samples, prompts, metadata, n, noun)
                _check_weighted(spec.name, spec.weight, scores)
                raw[spec.name] = scores
                if sample_groups is not None:
                    groups[spec.name] = sample_groups
                if sample_details is not None:
                    details[spec.name] = sample_details
            except RewardError as err:
                if spec.required:
                    raise
                errors[spec.name] = err

        # Rescale the surviving weights so a failed optional reward does not shrink the total.
        ok = [spec for spec in self.specs if spec.name in raw]
        ok_weight, all_weight = sum(abs(spec.weight) for spec in ok), sum(abs(spec.weight) for spec in self.specs)
        if ok_weight == 0.0 and all_weight > 0.0:
            raise RewardError(
                f"every reward with a non-zero weight failed on this batch, so there is no reward "
                f"signal: {'; '.join(str(e) for e in errors.values())}"
            )
        # Weights all 0 (metrics_only): the total is 0 whatever failed; nothing to rescale.
        rescale = all_weight / ok_weight if ok_weight else 1.0
        for name, err in errors.items():
            logger.warning(
                "optional reward %r failed on this batch of %d samples and is left out of the total "
                "(the other weights are rescaled by %.4g): %s", name, n, rescale, err,
            )

        total = np.zeros(n, dtype=np.float64)
        for spec in ok:
            total += (spec.weight * rescale) * raw[spec.name]
        _check_total(total, {spec.name: (spec.weight * rescale, raw[spec.name]) for spec in ok})

        metrics: dict[str, float] = {}
        for spec in self.specs:
            if spec.name in raw:
                metrics[f"reward/{spec.name}/mean"] = float(raw[spec.name].mean())
                metrics[f"reward/{spec.name}/std"] = float(raw[spec.name].std())
            if not spec.required:
                metrics[f"reward/{spec.name}/failed"] = 1.0 if spec.name in errors else 0.0
        metrics[f"reward/{_TOTAL}/mean"] = float(total.mean())
        metrics[f"reward/{_TOTAL}/std"] = float(total.std())
        for name, keys in groups.items():
            metrics.update(group_means([(key, float(v)) for key, v in zip(keys, raw[name]) if key is not None]))
            if name in details:
                metrics.update(group_means(detail_pairs(keys, details[name])))

        return RewardOutput(
            total=torch.from_numpy(total.astype(np.float32)),
            per_reward={name: torch.from_numpy(scores.astype(np.float32)) for name, scores in raw.items()},
            metrics=metrics,
            failed=list(errors),
            groups=groups,
            details=details,
        )

    def _media_plan(self, index: int, spec: RewardSpec, samples: MediaSamples) -> int | None:
        """None: the reward gets the MediaSamples; k: it gets `frames(k)`. Raise RewardInputError
        when the reward cannot score these samples."""
        scores = self.modalities[spec.name]
        present = samples.modalities
        native = scores & {VIDEO, AUDIO}
        key = f"reward.rewards[{index}]"
        if native:
            if not native & present:
                raise RewardInputError(
                    f"reward {spec.name!r} scores {_names(native)}, but the samples hold only {_names(present)}; "
                    f"drop {key} or pass its streams in the MediaSamples"
                )
            return None
        if "image" in scores and VIDEO in present:
            if spec.video_frames is None:
                raise RewardInputError(
                    f"reward {spec.name!r} scores images, but the samples are video; set {key}.video_frames "
                    f"(e.g. {key}.video_frames=4) to score that many evenly spaced frames of each video and "
                    f"average them"
                )
            return spec.video_frames
        raise RewardInputError(
            f"reward {spec.name!r} scores {_names(scores)}, but the samples hold only {_names(present)}; "
            f"drop {key} or pick a reward for {_names(present)}"
        )

    def _run(
        self, name: str, samples: Samples, prompts: Sequence[str], metadata: Sequence[dict], n: int, noun: str
    ) -> tuple[np.ndarray, Optional[list[Optional[str]]], Optional[list[dict[str, Any]]]]:
        """The reward's n scores, and its samples' groups and details when it returned a `RewardScores`."""
        thread = threading.get_ident()
        with self._running_lock:
            self._running[thread] = (name, time.monotonic())
        try:
            out = self._scorers[name](samples, prompts, metadata)
        except Exception as err:
            raise RewardError(f"reward {name!r} raised {type(err).__name__}: {err}") from err
        finally:
            with self._running_lock:
                self._running.pop(thread, None)
        if not isinstance(out, RewardScores):
            return _to_scores(name, out, n, noun), None, None
        problem = check_groups(out.groups, n, set(self.names) | {_TOTAL}) or check_details(out.details, n)
        if problem:
            raise RewardError(f"reward {name!r}: {problem}")
        sample_details = None if out.details is None else [dict(d) for d in out.details]
        return _to_scores(name, out.scores, n, noun), list(out.groups), sample_details


def _names(modalities: frozenset[str]) -> str:
    return " and ".join(sorted(modalities))


def _check_video_frames(spec: RewardSpec, modalities: frozenset[str]) -> None:
    """`video_frames` only on a reward that scores images and not video itself."""
    if spec.video_frames is None:
        return
    if VIDEO in modalities:
        raise RewardConfigError(
            f"reward {spec.name!r}: video_frames={spec.video_frames} but the reward scores video itself (it "
            f"gets the whole videos); remove video_frames"
        )
    if "image" not in modalities:
        raise RewardConfigError(
            f"reward {spec.name!r}: video_frames={spec.video_frames} but the reward scores {_names(modalities)}, "
            f"not images; video_frames hands an image reward frames of each video. Remove it"
        )


def _to_scores(name: str, out: Any, n: int, noun: str = "samples") -> np.ndarray:
    """Normalise a scorer's return value to a finite float64 array [n], or raise RewardError."""
    try:
        if isinstance(out, torch.Tensor):
            scores = out.detach().to(device="cpu", dtype=torch.float64).numpy()
        else:
            scores = np.asarray(out, dtype=np.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        raise RewardError(
            f"reward {name!r} returned a {type(out).__name__} that is not a list of numbers ({err}); "
            f"a scorer must return one float per sample"
        ) from err
    if scores.shape != (n,):
        raise RewardError(
            f"reward {name!r} returned scores of shape {tuple(scores.shape)} for {n} {noun}; "
            f"expected {n} scores, one float per sample (a list or a 1-D tensor)"
        )
    # Checked against float32's range: a float64 beyond it would become inf in the output tensors.
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(~(np.abs(scores) <= np.finfo(np.float32).max))
    if bad.size:
        raise RewardError(
            f"reward {name!r} returned non-finite scores at sample index {_samples(bad, scores, '')}; "
            f"a reward must be finite (and within float32 range): fix the scorer or clamp its output"
        )
    return scores


def _samples(bad: np.ndarray, scores: np.ndarray, spec: str) -> str:
    """"i (score), ..." for the first 8 bad sample indices, and how many more there are."""
    shown = ", ".join(f"{i} ({scores[i]:{spec}})" for i in bad[:8])
    return shown + (f" and {bad.size - 8} more" if bad.size > 8 else "")


def _check_weighted(name: str, weight: float, scores: np.ndarray) -> None:
    """Raise RewardError if |weight * score| > MAX_ABS_REWARD for some sample (weight 0: log only)."""
    if weight == 0.0:
        return
    bad = np.flatnonzero(np.abs(weight * scores) > MAX_ABS_REWARD)
    if bad.size:
        raise RewardError(
            f"reward {name!r} returned scores too large to train on at sample index {_samples(bad, scores, '.4g')}: with "
            f"its weight {weight:g}, |weight * score| must be at most {MAX_ABS_REWARD:g}, or the float32 "
            f"advantage overflows and the loss becomes NaN. Rescale the reward (a smaller weight or "
            f"scale option) or clamp its output"
        )


def _check_total(total: np.ndarray, parts: dict[str, tuple[float, np.ndarray]]) -> None:
    """Raise RewardError naming the sample and each reward's share if |total| > MAX_ABS_REWARD."""
    bad = np.flatnonzero(~(np.abs(total) <= MAX_ABS_REWARD))
    if not bad.size:
        return
    i = int(bad[0])
    shares = sorted(parts.items(), key=lambda item: -abs(item[1][0] * item[1][1][i]))
    shown = ", ".join(f"{name!r} {w * scores[i]:.4g} (score {scores[i]:.4g} x weight {w:g})" for name, (w, scores) in shares)
    more = f" (and at {bad.size - 1} more sample(s))" if bad.size > 1 else ""
    raise RewardError(
        f"the weighted reward total at sample index {i} is {total[i]:.4g}{more}, beyond +-{MAX_ABS_REWARD:g}, "
        f"where the float32 advantage overflows and the loss becomes NaN; the rewards' shares: {shown}. "
        f"Rescale the largest reward (a smaller weight or scale option) or clamp its output"
    )


def _as_spec(spec: RewardSpec | Mapping[str, Any], index: int) -> RewardSpec:
    if isinstance(spec, RewardSpec):
        return spec
    if isinstance(spec, Mapping):
        allowed = {"name", "weight", "required", "kwargs", "video_frames"}
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise RewardConfigError(
                f"reward list entry {index} has unknown key(s) {unknown}; allowed keys: "
                f"{sorted(allowed)} (reward options go under kwargs)"
            )
        if "name" not in spec:
            raise RewardConfigError(f"reward list entry {index} has no 'name'; got {dict(spec)!r}")
        return RewardSpec(**spec)
    raise RewardConfigError(
        f"reward list entry {index} has type {type(spec).__name__}; expected a RewardSpec or a "
        f"mapping with keys name, weight, required, kwargs, video_frames"
    )

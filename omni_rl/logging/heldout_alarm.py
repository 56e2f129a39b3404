"""The held-out alarm: the held-out score falls while the training reward keeps rising.

Reward hacking looks like that (verl-omni #563). At each validation `HeldoutAlarm.update`
compares the held-out metric with its best so far, in standard errors of the difference
(`drop_se`), and the training reward's mean since the previous validation with its value at the
best; it fires when `drop_se > alarm_sigmas` and the training reward is higher, logs the
`alarm/*` metrics and a warning, and with `alarm_stop` stops the run after the step's checkpoint.
Its options are `trainer.logger_options.alarm_*` (`AlarmOptions`); docs/evaluation.md (The
held-out alarm) describes it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from omni_rl.option import ComponentOptions, option
from omni_rl.errors import OmniRunError


@dataclass
class AlarmOptions(ComponentOptions):
    """The held-out alarm's options (`trainer.logger_options.alarm_*`)."""

    alarm: bool = option(True, "Log the held-out alarm's alarm/* metrics at each validation after the first, and warn when the held-out metric falls while the training reward rises.")
    alarm_heldout_metric: str = option("val/reward/total/mean", "The validation figure the alarm watches (a .../mean metric; its .../std gives the standard error). Point data.val_prompt_file at a benchmark's held-out prompts and reward.val_rewards at its scorers to make it a held-out benchmark score.")
    alarm_train_metric: str = option("reward/total/mean", "The training metric whose rise, with a held-out fall, fires the alarm.")
    alarm_sigmas: float = option(2.0, "How many standard errors below its best the held-out metric must fall for the alarm.")
    alarm_stop: bool = option(False, "Stop the run (after the step's checkpoint, exit 1) when the alarm fires; by default it only warns.")

    def check(self) -> None:
        if not (math.isfinite(self.alarm_sigmas) and self.alarm_sigmas > 0):
            raise ValueError(f"alarm_sigmas={self.alarm_sigmas!r}: expected a finite number > 0 of standard errors")
        if not self.alarm_heldout_metric.endswith("/mean"):
            raise ValueError(f"alarm_heldout_metric={self.alarm_heldout_metric!r}: expected a validation .../mean "
                             f"figure (e.g. val/reward/total/mean), whose .../std gives its standard error")


class RewardHackingAlarm(OmniRunError):
    """The alarm fired with `alarm_stop`."""


@dataclass
class _Point:
    step: int
    value: float
    se: float
    train: Optional[float]


class HeldoutAlarm:
    def __init__(self, options: AlarmOptions):
        self.options = options
        self.best: Optional[_Point] = None
        self._window: list[float] = []

    def observe_train(self, metrics: dict[str, float]) -> None:
        """Record one training step's metrics (its `train_metric`, where present)."""
        value = metrics.get(self.options.alarm_train_metric)
        if value is not None and math.isfinite(value):
            self._window.append(float(value))

    def update(self, step: int, val_metrics: dict[str, float], num_samples: int) -> tuple[dict[str, float], Optional[str]]:
        """The alarm/* metrics of this validation and, when it fires, the warning's text."""
        o = self.options
        value = val_metrics.get(o.alarm_heldout_metric)
        if not o.alarm or value is None or not math.isfinite(value):
            return {}, None
        std = val_metrics.get(o.alarm_heldout_metric[: -len("/mean")] + "/std", 0.0)
        now = _Point(step, float(value), float(std) / math.sqrt(max(num_samples, 1)),
                     sum(self._window) / len(self._window) if self._window else None)
        self._window = []
        if self.best is not None and self.best.train is None:
            # The best came before any training step (the step-0 validation): the first training
            # window stands for the reward at that point.
            self.best.train = now.train
        if self.best is None or now.value >= self.best.value:
            self.best = now
            return {"alarm/heldout_best": now.value, "alarm/heldout_drop_se": 0.0, "alarm/reward_hacking": 0.0}, None
        best = self.best
        spread = math.hypot(best.se, now.se)
        drop_se = (best.value - now.value) / spread if spread > 0 else math.inf
        rise = (now.train - best.train) if (now.train is not None and best.train is not None) else math.nan
        fired = drop_se > o.alarm_sigmas and rise > 0
        metrics = {"alarm/heldout_best": best.value, "alarm/heldout_drop_se": min(drop_se, 1e6),
                   "alarm/train_rise_since_best": rise, "alarm/reward_hacking": float(fired)}
        if not fired:
            return metrics, None
        return metrics, (
            f"held-out {o.alarm_heldout_metric} fell from {best.value:.4g} (step {best.step}) to {now.value:.4g} (step {step}), "
            f"{drop_se:.1f} standard errors, while the training {o.alarm_train_metric} rose from {best.train:.4g} to "
            f"{now.train:.4g}: the policy may be exploiting the proxy reward; look at the samples of both steps "
            f"(trainer.logger_options.alarm_stop=true stops such a run)")
